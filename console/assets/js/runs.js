// The runs page: every run, newest first, filtered by state, kind and
// model (the filters live in the URL: #/runs?state=running&model=x).
// It reads the list once (run.list, after the connection follows run
// changes) and then applies each runs.changed: a new run appears, a run
// that changes state moves, without polling.

import { h, replace, status, fmtTime, errorText, table, alertBox, say } from './dom.js';
import { watchRuns, newer } from './rpc.js';

const STATES = ['queued', 'running', 'waiting', 'paused', 'interrupted', 'succeeded', 'failed', 'cancelled'];
const KINDS = ['agent', 'plan', 'dag'];

export function runsPage(conn, root, _, params) {
  const select = (name, label, options) => h('label', {}, label + ' ',
    h('select', { name, onchange: apply },
      h('option', { value: '' }, 'any'),
      options.map((o) => h('option', { value: o, selected: params.get(name) === o }, o))));
  const model = h('input', { name: 'model', type: 'search', value: params.get('model') || '', list: 'models-seen', placeholder: 'any', oninput: () => render() });
  const seen = h('datalist', { id: 'models-seen' });
  const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); apply(); } },
    select('state', 'State', STATES), select('kind', 'Kind', KINDS),
    h('label', {}, 'Model ', model), seen);
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  const list = h('div', { id: 'runs' });
  replace(root, h('h1', {}, 'Runs'), newRun(conn), form, note, list);

  function apply() {
    const q = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value) q.set(el.name, el.value);
    const hash = '#/runs' + (q.toString() ? '?' + q : '');
    history.replaceState(null, '', hash);
    refresh();
  }

  const runs = new Map(); // id -> summary, from run.list and runs.changed
  function render() {
    const state = form.elements.state.value, kind = form.elements.kind.value, m = model.value.trim().toLowerCase();
    const at = (r) => Date.parse(r.created_at) || 0;
    const all = [...runs.values()].sort((a, b) => at(b) - at(a) || b.id.localeCompare(a.id));
    const shown = all.filter((r) => (!state || r.status === state) && (!kind || (r.kind || 'agent') === kind) && (!m || (r.model || '').toLowerCase().includes(m)));
    replace(seen, [...new Set(all.map((r) => r.model).filter(Boolean))].map((x) => h('option', { value: x })));
    note.textContent = `${shown.length} of ${all.length} runs shown.`;
    replace(list, shown.length === 0 ? h('p', {}, 'No runs match.') : table(null,
      ['Run', 'Goal', 'State', 'Kind', 'Model', 'Events', 'Updated'],
      shown.map((r) => [
        h('a', { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id),
        h('span', { class: 'goal' }, r.goal), status(r.status), r.kind || 'agent', r.model || '',
        String(r.last_seq), fmtTime(r.updated_at)]),
      { class: 'runs' }));
  }

  let listing = 0; // the newest refresh: an older answer is dropped
  async function refresh() {
    const n = ++listing;
    try {
      const state = form.elements.state.value;
      const res = await conn.call('run.list', { limit: 200, ...(state ? { status: [state] } : {}) });
      if (n !== listing) return;
      const old = new Map(runs);
      runs.clear();
      for (const r of res.runs) runs.set(r.id, newer(old.get(r.id), r) ? r : old.get(r.id));
      render();
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not list the runs: ' + errorText(e);
    }
  }
  function changed(r) {
    if (!newer(runs.get(r.id), r)) return;
    runs.set(r.id, r);
    render();
  }
  return watchRuns(conn, refresh, changed);
}

// newRun is the form that starts a run (run.start) and opens its page.
function newRun(conn) {
  const goal = h('textarea', { id: 'new-goal', name: 'goal', rows: 2, required: true, placeholder: 'What should the run do?' });
  const model = h('input', { type: 'text', id: 'new-model', name: 'model', placeholder: 'the default model' });
  const box = alertBox();
  return h('details', { class: 'card new-run' }, h('summary', {}, 'Start a run'),
    h('form', { onsubmit: async (e) => {
      e.preventDefault();
      if (!goal.value.trim()) { say(box, 'Say what the run should do.', false); goal.focus(); return; }
      try {
        const run = await conn.call('run.start', { goal: goal.value, ...(model.value.trim() ? { model: model.value.trim() } : {}) });
        location.hash = `#/runs/${encodeURIComponent(run.id)}`;
      } catch (err) {
        say(box, `Not started: ${errorText(err)}`, false);
      }
    } },
    h('label', { for: 'new-goal' }, 'Goal'), goal,
    h('div', { class: 'row' }, h('label', { for: 'new-model' }, 'Model'), model, h('button', { type: 'submit' }, 'Start')),
    box));
}
