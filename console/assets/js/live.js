// Live: the events of every run that has not ended, as they happen,
// newest first (the last 100 kept). The runs are found with run.list
// once and followed from their last seq, so only new events show; a run
// that starts later is found by its runs.changed and followed from the
// event that announced it. Nothing polls.
//
// #/live?record=1 also records, for each event shown, when its node was
// inserted (performance.timeOrigin + performance.now(), in ms since the
// epoch) beside its journal time and when its frame arrived:
// window.keelConsole.marks, read by the console latency benchmark
// (bench/console).

import { h, replace, errorText, parseTime } from './dom.js';
import { watchRuns } from './rpc.js';
import { eventItem } from './run.js';

const KEEP = 100;
const ACTIVE = ['queued', 'running', 'waiting', 'paused'];

export function livePage(conn, root, _, params) {
  const record = params.get('record') === '1';
  const marks = [];
  if (record) window.keelConsole.marks = marks;
  const note = h('p', { class: 'muted', id: 'live-count', 'aria-live': 'polite' });
  const list = h('ol', { class: 'events live', id: 'live-events', reversed: true });
  replace(root, h('h1', {}, 'Live events'), note, list);

  const followed = new Map(); // run id -> stop
  const onEvent = (ev, at) => {
    if (ev.seq === 0) return; // deltas: on the run's own page
    const li = eventItem(ev, false);
    list.prepend(li);
    if (record) {
      marks.push({ run: ev.run_id, seq: ev.seq, type: ev.type, journaled: parseTime(ev.time),
        received: performance.timeOrigin + at, shown: performance.timeOrigin + performance.now() });
    }
    while (list.childElementCount > KEEP) list.lastElementChild.remove();
    if (['run.succeeded', 'run.failed', 'run.cancelled'].includes(ev.type) && followed.has(ev.run_id)) {
      followed.get(ev.run_id)();
      followed.set(ev.run_id, null); // ended: not followed again
      count();
    }
  };
  const count = () => {
    let n = 0;
    for (const stop of followed.values()) if (stop) n++;
    note.textContent = `Following ${n} runs that have not ended.`;
  };
  const follow = (id, after) => {
    if (followed.has(id)) return;
    followed.set(id, conn.subscribe(id, after, onEvent));
  };
  async function refresh() {
    try {
      const { runs } = await conn.call('run.list', { status: ACTIVE, limit: 1000 });
      for (const r of runs) follow(r.id, r.last_seq);
      count();
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not list the runs: ' + errorText(e);
    }
  }
  const stopWatch = watchRuns(conn, refresh, (r) => {
    if (!ACTIVE.includes(r.status)) return;
    follow(r.id, Math.max(0, (r.last_seq || 0) - 1));
    count();
  });
  return () => {
    stopWatch();
    for (const stop of followed.values()) if (stop) stop();
  };
}
