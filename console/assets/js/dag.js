// A plan or DAG run's steps drawn as a graph (inline SVG), each with its
// state written in its box, plus the same as a list for screen readers.

import { h, s } from './dom.js';

// planState reads a run's events: the latest plan (plan.proposed) and
// each step's state (step.started, step.finished). null if no plan.
export function planState(events) {
  let plan = null;
  const states = new Map();
  for (const ev of events) {
    const d = ev.data || {};
    if (ev.type === 'plan.proposed') plan = d.plan;
    else if (ev.type === 'step.started') states.set(d.step_id, { state: 'running', run: d.run, attempt: d.attempt });
    else if (ev.type === 'step.finished') states.set(d.step_id, { state: d.status || 'finished', run: d.run, attempt: d.attempt });
  }
  return plan ? { plan, states } : null;
}

const W = 170, H = 46, GX = 60, GY = 22;

// dagGraph draws the steps in columns by depth (longest chain of
// dependencies before them), edges from each dependency.
export function dagGraph({ plan, states }) {
  const steps = plan.steps || [];
  const byID = new Map(steps.map((st) => [st.id, st]));
  const depth = new Map();
  const depthOf = (id, seen = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const deps = (byID.get(id)?.depends_on || []).filter((d) => byID.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map((x) => depthOf(x, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  const cols = [];
  for (const st of steps) {
    const d = depthOf(st.id);
    (cols[d] ||= []).push(st);
  }
  const pos = new Map();
  cols.forEach((col, x) => col.forEach((st, y) => pos.set(st.id, { x: x * (W + GX) + 4, y: y * (H + GY) + 4 })));
  const width = cols.length * (W + GX), height = Math.max(...cols.map((c) => c.length)) * (H + GY);
  const stateOf = (id) => states.get(id)?.state || 'pending';

  const svg = s('svg', { viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-labelledby': 'dag-title', class: 'dag' },
    s('title', { id: 'dag-title' }, `Plan of ${steps.length} steps`),
    s('defs', {}, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 8, markerHeight: 8, orient: 'auto' },
      s('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrow' }))),
    steps.flatMap((st) => (st.depends_on || []).filter((d) => pos.has(d)).map((d) => {
      const a = pos.get(d), b = pos.get(st.id);
      return s('path', { class: 'edge', 'marker-end': 'url(#arrow)',
        d: `M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}` });
    })),
    steps.map((st) => {
      const p = pos.get(st.id), state = stateOf(st.id);
      return s('g', { class: `node st-${state}`, transform: `translate(${p.x},${p.y})`, 'data-step': st.id },
        s('rect', { width: W, height: H, rx: 6 }),
        s('text', { x: 8, y: 18, class: 'node-id' }, st.id),
        s('text', { x: 8, y: 36, class: 'node-state' }, state));
    }));
  const list = h('ul', { class: 'dag-list' }, steps.map((st) => {
    const info = states.get(st.id);
    return h('li', {}, h('b', {}, st.id), `: ${stateOf(st.id)}`,
      st.depends_on?.length ? ` (after ${st.depends_on.join(', ')})` : '',
      info?.run ? [' — ', h('a', { href: `#/runs/${encodeURIComponent(info.run)}` }, 'its run')] : '',
      h('div', { class: 'muted' }, st.goal));
  }));
  return h('div', { class: 'dag-wrap' }, h('div', { class: 'scroll' }, svg), list);
}
