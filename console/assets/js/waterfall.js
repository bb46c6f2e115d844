// A run's trace as a waterfall: one row per span, in tree order, with a
// bar placed on the run's time axis. The numbers are in the row's text;
// the bar only draws them.

import { h, status, fmtDur, parseTime } from './dom.js';

// waterfall returns a table of the spans (run.get's spans), or a note
// when there are none. A running span's bar reaches now.
export function waterfall(spans) {
  if (!spans || spans.length === 0) return h('p', { class: 'muted' }, 'No spans yet.');
  const now = Date.now();
  const rows = spans.map((sp) => {
    const start = parseTime(sp.start);
    const dur = sp.status === 'running' ? Math.max(0, now - start) : (sp.duration_ns || 0) / 1e6;
    return { sp, start, end: start + dur, children: [] };
  });
  const t0 = Math.min(...rows.map((r) => r.start));
  const total = Math.max(1e-3, Math.max(...rows.map((r) => r.end)) - t0);
  const byID = new Map(rows.map((r) => [r.sp.id, r]));
  const roots = [];
  for (const r of rows) {
    const p = byID.get(r.sp.parent_id);
    if (p && p !== r) p.children.push(r); else roots.push(r);
  }
  const ordered = [];
  const walk = (r, depth) => {
    ordered.push([r, depth]);
    r.children.sort((a, b) => a.start - b.start).forEach((c) => walk(c, depth + 1));
  };
  roots.sort((a, b) => a.start - b.start).forEach((r) => walk(r, 0));

  const body = ordered.map(([r, depth]) => {
    const sp = r.sp;
    const bar = h('span', { class: `bar k-${sp.kind.replace('.', '-')} st-${sp.status}` });
    bar.style.left = `${((r.start - t0) / total) * 100}%`;
    bar.style.width = `${Math.max(0.3, ((r.end - r.start) / total) * 100)}%`;
    const tokens = sp.prompt_tokens || sp.completion_tokens ? `${sp.prompt_tokens || 0}→${sp.completion_tokens || 0} tok` : '';
    const name = sp.name && sp.name !== sp.kind ? sp.name : '';
    const label = h('span', { class: 'span-name' }, sp.kind, name ? [' ', h('b', {}, name)] : '', sp.step ? ` (step ${sp.step})` : '');
    label.style.paddingLeft = `${depth * 1.2}em`;
    return h('tr', { 'data-kind': sp.kind, 'data-status': sp.status },
      h('th', { scope: 'row' }, label),
      h('td', {}, status(sp.status), sp.error ? h('span', { class: 'err' }, ' ', sp.error) : null),
      h('td', { class: 'num' }, `+${fmtDur((r.start - t0) * 1e6)}`),
      h('td', { class: 'num' }, fmtDur((r.end - r.start) * 1e6)),
      h('td', { class: 'num' }, tokens, sp.cost_usd ? ` $${sp.cost_usd.toFixed(6)}` : ''),
      h('td', { class: 'track', 'aria-hidden': 'true' }, bar));
  });
  return h('div', { class: 'scroll' }, h('table', { class: 'waterfall' },
    h('caption', {}, `${spans.length} spans over ${fmtDur(total * 1e6)}`),
    h('thead', {}, h('tr', {}, ['Span', 'Status', 'Start', 'Duration', 'Tokens, cost', 'Timeline'].map((x) => h('th', { scope: 'col' }, x)))),
    h('tbody', {}, body)));
}
