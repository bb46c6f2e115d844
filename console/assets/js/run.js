// One run: its facts, steering, what it waits on, its plan graph, its
// waterfall, and its events as they happen (run.subscribe).

import { h, replace, status, fmtTime, fmtUSD, json, errorText, alertBox, say, terminal } from './dom.js';
import { waterfall } from './waterfall.js';
import { planState, dagGraph } from './dag.js';
import { openWaits, waitCard } from './approvals.js';
import { watchRuns, newer } from './rpc.js';

// summary says what an event is about in a line of text.
export function summary(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case 'run.started': return `${d.goal} (model ${d.model}; tools: ${(d.tools || []).join(', ') || 'none'})`;
    case 'model.result': {
      const calls = (d.tool_calls || []).map((c) => c.name).join(', ');
      return `step ${d.step}, ${d.model}: ${d.prompt_tokens}→${d.completion_tokens} tokens` +
        (calls ? `; calls ${calls}` : '') + (d.content ? `; “${d.content.slice(0, 200)}”` : '');
    }
    case 'tool.call': return `${d.call.name} ${JSON.stringify(d.call.arguments ?? {}).slice(0, 200)}`;
    case 'tool.result': return `${d.name}: ${d.error ? 'error ' + (d.error.code || '') + ' ' + (d.error.message || '') : 'ok'} in ${d.duration_ms} ms`;
    case 'approval.requested': return `${d.call.name} waits for approval (${d.side_effects})`;
    case 'approval.decision': return `${d.call_id} ${d.approved ? 'approved' : 'denied'}${d.reason ? ': ' + d.reason : ''}${d.arguments ? ' (arguments edited)' : ''}`;
    case 'run.waiting': return d.reason || '';
    case 'human.decision': return `${d.call_id}: ${d.decision}${d.note ? ' — ' + d.note : ''}`;
    case 'human.message': return d.content;
    case 'human.takeover': case 'human.handback': return d.note || '';
    case 'run.succeeded': return d.result || '';
    case 'run.failed': case 'run.cancelled': case 'run.interrupted': case 'run.paused': return d.reason || '';
    case 'run.forked': return `from ${d.from} at step ${d.step}`;
    case 'plan.proposed': return `${(d.plan?.steps || []).length} steps (revision ${d.revision})${d.reason ? ': ' + d.reason : ''}`;
    case 'step.started': return `${d.step_id} (attempt ${d.attempt})`;
    case 'step.finished': return `${d.step_id}: ${d.status}${d.error ? ' — ' + d.error : ''}`;
    case 'step.retry': return `step ${d.step}, attempt ${d.attempt}: ${d.error}`;
    default: return '';
  }
}

// eventItem is one event of the list: seq, time, type, summary and,
// unless withData is false, its data (JSON, folded).
export function eventItem(ev, withData = true) {
  return h('li', { class: `ev t-${ev.type.replace(/\./g, '-')}`, 'data-seq': ev.seq, 'data-type': ev.type, 'data-run': ev.run_id },
    h('span', { class: 'seq' }, `#${ev.seq}`), ' ',
    h('time', { datetime: ev.time }, fmtTime(ev.time)), ' ',
    h('b', { class: 'type' }, ev.type), ' ',
    h('span', { class: 'sum' }, summary(ev)),
    withData && ev.data ? h('details', {}, h('summary', {}, 'data'), h('pre', {}, json(ev.data))) : null,
    withData ? null : [' ', h('a', { href: `#/runs/${encodeURIComponent(ev.run_id)}` }, ev.run_id)]);
}

export function runPage(conn, root, [id]) {
  const facts = h('dl', { class: 'facts' });
  const title = h('h1', {}, 'Run ', h('code', {}, id));
  const steer = steering(conn, id);
  const waits = h('section', { 'aria-labelledby': 'waits-h', hidden: true }, h('h2', { id: 'waits-h' }, 'Waiting for you'));
  const waitList = h('div');
  waits.append(waitList);
  const graph = h('section', { 'aria-labelledby': 'graph-h', hidden: true }, h('h2', { id: 'graph-h' }, 'Plan'));
  const graphBody = h('div');
  graph.append(graphBody);
  const wf = h('div', { id: 'waterfall' });
  const evList = h('ol', { class: 'events', id: 'events', 'aria-live': 'off' });
  const live = h('p', { class: 'muted', id: 'live-note' });
  replace(root, title, facts, steer.node, waits, graph,
    h('section', { 'aria-labelledby': 'wf-h' }, h('h2', { id: 'wf-h' }, 'Waterfall'), wf),
    h('section', { 'aria-labelledby': 'ev-h' }, h('h2', { id: 'ev-h' }, 'Events'), live, evList));

  const events = [];
  let current = null, labels = [], deltas = new Map();
  const answered = new Set(); // model steps whose model.result is shown
  const shownWaits = new Map();

  function renderFacts() {
    const r = current;
    if (!r) return;
    let pt = 0, ct = 0, cost = 0;
    for (const ev of events) {
      if (ev.type !== 'model.result') continue;
      pt += ev.data.prompt_tokens || 0; ct += ev.data.completion_tokens || 0; cost += ev.data.cost_usd || 0;
    }
    const row = (k, ...v) => [h('dt', {}, k), h('dd', {}, ...v)];
    replace(facts,
      row('Goal', h('span', { class: 'goal' }, r.goal)),
      row('State', status(r.status), r.error ? ` — ${r.error}` : ''),
      r.result ? row('Result', h('span', { class: 'result' }, r.result)) : null,
      row('Kind', r.kind || 'agent'), row('Model', r.model || 'default'),
      row('Tokens', `${pt} in, ${ct} out`, h('span', { class: 'muted' }, ` (${pt + ct} total)`)),
      row('Cost', fmtUSD(cost)),
      row('Labels', labels && labels.length ? labels.join(', ') : 'none'),
      r.parent_id ? row('Part of', h('a', { href: `#/runs/${encodeURIComponent(r.parent_id)}` }, r.parent_id), r.parent_step ? ` step ${r.parent_step}` : '') : null,
      row('Created', fmtTime(r.created_at)), row('Updated', fmtTime(r.updated_at)));
    steer.update(r, events);
  }

  function renderWaits() {
    const open = openWaits(events);
    const keys = new Set(open.map((w) => w.data.call.id));
    for (const [k, card] of shownWaits) if (!keys.has(k)) { card.remove(); shownWaits.delete(k); }
    for (const w of open) {
      if (shownWaits.has(w.data.call.id)) continue;
      const card = waitCard(conn, current || { id, goal: '' }, w, null);
      shownWaits.set(w.data.call.id, card);
      waitList.append(card);
    }
    waits.hidden = open.length === 0;
  }

  function renderGraph() {
    const ps = planState(events);
    graph.hidden = !ps;
    if (ps) replace(graphBody, dagGraph(ps));
  }

  // The trace and the run's own fields come from run.get, read again
  // (at most every 250 ms) as events arrive.
  let detailTimer = null, detailBusy = false, detailAgain = false;
  async function loadDetail() {
    if (detailBusy) { detailAgain = true; return; }
    detailBusy = true;
    try {
      const det = await conn.call('run.get', { run_id: id });
      if (!current || newer(current, det.run)) current = det.run;
      labels = det.labels || [];
      replace(wf, waterfall(det.spans));
      wf.dataset.status = det.run.status;
      renderFacts();
      ticking();
    } catch (e) {
      if (e.code === -32001) replace(facts, h('p', { role: 'alert' }, `No run ${id}.`));
      else if (conn.state === 'open') live.textContent = 'Could not read the run: ' + errorText(e);
    } finally {
      detailBusy = false;
      if (detailAgain) { detailAgain = false; scheduleDetail(); }
    }
  }
  function scheduleDetail() {
    if (!detailTimer) detailTimer = setTimeout(() => { detailTimer = null; loadDetail(); }, 250);
  }

  function onEvent(ev) {
    if (ev.type === 'model.delta') {
      const step = ev.data.step;
      // A subscription replays stored events first: a live fragment of a
      // step can come after the step's stored result. Its text is there.
      if (answered.has(step)) return;
      let li = deltas.get(step);
      if (!li) {
        li = h('li', { class: 'ev delta', 'data-type': 'model.delta' }, h('b', { class: 'type' }, `step ${step} streaming: `), h('span', { class: 'text' }));
        deltas.set(step, li);
        evList.append(li);
      }
      const text = li.querySelector('.text');
      text.textContent = (ev.data.restart ? '' : text.textContent) + ev.data.content;
      return;
    }
    if (ev.type === 'model.result') answered.add(ev.data.step);
    if (ev.type === 'model.result' && deltas.has(ev.data.step)) {
      deltas.get(ev.data.step).remove();
      deltas.delete(ev.data.step);
    }
    events.push(ev);
    evList.append(eventItem(ev));
    live.textContent = `${events.length} events${current && terminal.has(current.status) ? '' : '; following live'}.`;
    if (current) {
      if (ev.data?.status) current.status = ev.data.status;
      renderFacts();
      ticking();
    }
    renderWaits();
    if (['plan.proposed', 'step.started', 'step.finished'].includes(ev.type)) renderGraph();
    scheduleDetail();
  }

  // Running spans grow: while the run is running, and only then, the
  // waterfall is redrawn every 2 s. A page of a run that waits, is
  // paused or has ended runs no timer and costs the daemon nothing.
  let tick = null;
  function ticking() {
    const on = current?.status === 'running';
    if (on && !tick) tick = setInterval(() => scheduleDetail(), 2000);
    if (!on && tick) { clearInterval(tick); tick = null; }
  }
  const unsubscribe = conn.subscribe(id, 0, onEvent);
  const onOpen = (e) => { if (e.detail.state === 'open') loadDetail(); };
  conn.addEventListener('state', onOpen);
  // Its state as it changes (runs.changed), also for a change no event
  // of the run says outright (waiting, resumed).
  const stopWatch = watchRuns(conn, () => {}, (r) => {
    if (r.id !== id || (current && !newer(current, r))) return;
    current = { ...current, ...r };
    renderFacts();
    ticking();
  });
  loadDetail();
  return () => {
    unsubscribe();
    stopWatch();
    clearInterval(tick);
    clearTimeout(detailTimer);
    conn.removeEventListener('state', onOpen);
  };
}

// steering is the run's controls: say, pause, resume, cancel, take over
// and hand back, fork from a step, replay. Each button says what the
// daemon answered.
function steering(conn, id) {
  const box = alertBox();
  const act = async (what, method, params, after) => {
    try {
      const res = await conn.call(method, { run_id: id, ...params });
      say(box, after ? after(res) : `${what}: done.`, true);
      return res;
    } catch (e) {
      say(box, `${what} failed: ${errorText(e)}`, false);
      return undefined;
    }
  };
  const message = h('textarea', { id: 'say-text', rows: 2, placeholder: 'Tell the run something; its model reads it before its next step' });
  const note = h('input', { type: 'text', id: 'control-note', placeholder: 'optional' });
  const forkStep = h('input', { type: 'number', id: 'fork-step', min: 0, value: 1, class: 'short' });
  const forkModel = h('input', { type: 'text', id: 'fork-model', placeholder: 'same model' });
  const forkGoal = h('input', { type: 'text', id: 'fork-goal', placeholder: 'same goal' });
  const replayOut = h('div', { class: 'replay' });
  const btn = (label, onclick) => h('button', { type: 'button', onclick }, label);
  const buttons = {
    say: btn('Say', async () => {
      if (!message.value.trim()) { say(box, 'Write a message first.', false); message.focus(); return; }
      if (await act('Say', 'run.say', { message: message.value })) message.value = '';
    }),
    pause: btn('Pause', () => act('Pause', 'run.pause', {}, () => 'Pausing at the next step boundary.')),
    resume: btn('Resume', () => act('Resume', 'run.resume', {})),
    cancel: btn('Cancel run', () => act('Cancel', 'run.cancel', {})),
    takeover: btn('Take over', () => act('Take over', 'run.takeover', { note: note.value || undefined }, () => 'You have control: the run stops at its next step boundary.')),
    handback: btn('Hand back', () => act('Hand back', 'run.handback', { note: note.value || undefined }, () => 'Control handed back.')),
    fork: btn('Fork', async () => {
      const res = await act('Fork', 'run.fork', { step: Number(forkStep.value), model: forkModel.value || undefined, goal: forkGoal.value || undefined },
        (r) => `Forked as ${r.id}.`);
      if (res) location.hash = `#/runs/${encodeURIComponent(res.id)}`;
    }),
    replay: btn('Replay', async () => {
      const res = await act('Replay', 'run.replay', {}, (r) => r.matches
        ? `Replayed ${r.events.length} events from the journal: they match.`
        : `Replayed ${r.events.length} events: they differ. ${r.difference}`);
      if (res) replace(replayOut, h('p', {}, res.matches ? 'Replay matches the journal.' : `Replay differs: ${res.difference}`));
    }),
  };
  for (const [name, b] of Object.entries(buttons)) b.dataset.action = name;
  const node = h('section', { 'aria-labelledby': 'steer-h', class: 'steer' },
    h('h2', { id: 'steer-h' }, 'Steer'),
    h('div', { class: 'row' }, h('label', { for: 'say-text' }, 'Message'), message, buttons.say),
    h('div', { class: 'row' }, buttons.pause, buttons.resume, buttons.cancel),
    h('div', { class: 'row' }, h('label', { for: 'control-note' }, 'Note'), note, buttons.takeover, buttons.handback),
    h('div', { class: 'row' }, h('label', { for: 'fork-step' }, 'Fork from step'), forkStep,
      h('label', { for: 'fork-model' }, 'model'), forkModel, h('label', { for: 'fork-goal' }, 'goal'), forkGoal, buttons.fork),
    h('div', { class: 'row' }, buttons.replay, replayOut),
    box);
  // update enables what the run's state allows; the daemon has the last
  // word (its refusals are shown).
  const update = (run, events) => {
    const st = run.status, ended = terminal.has(st);
    let taken = false;
    for (const ev of events) {
      if (ev.type === 'human.takeover') taken = true;
      if (ev.type === 'human.handback') taken = false;
    }
    buttons.say.disabled = ended;
    buttons.pause.disabled = st !== 'running';
    buttons.resume.disabled = st !== 'paused' || taken;
    buttons.cancel.disabled = ended;
    buttons.takeover.disabled = ended || taken;
    buttons.handback.disabled = !taken || ended;
    buttons.fork.disabled = st === 'running' || st === 'queued';
    buttons.replay.disabled = !ended;
    node.dataset.takenOver = String(taken);
  };
  return { node, update };
}
