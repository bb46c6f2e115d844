// Live: the events of every run that has not ended, as they happen,
// newest first (the last 100 kept). Runs are found with run.list every
// second and followed from their last seq then, so only new events show.
//
// #/live?record=1 also records, for each event shown, when its node was
// inserted (performance.timeOrigin + performance.now(), in ms since the
// epoch) beside its journal time and when its frame arrived:
// window.keelConsole.marks, read by the console latency benchmark
// (bench/console).

import { h, replace, errorText, parseTime } from './dom.js';
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
    }
  };
  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const { runs } = await conn.call('run.list', { status: ACTIVE, limit: 1000 });
      for (const r of runs) if (!followed.has(r.id)) followed.set(r.id, conn.subscribe(r.id, r.last_seq, onEvent));
      note.textContent = `Following ${runs.length} runs that have not ended.`;
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not list the runs: ' + errorText(e);
    } finally {
      busy = false;
    }
  }
  const onOpen = (e) => { if (e.detail.state === 'open') refresh(); };
  conn.addEventListener('state', onOpen);
  refresh();
  const timer = setInterval(refresh, 1000);
  return () => {
    clearInterval(timer);
    conn.removeEventListener('state', onOpen);
    for (const stop of followed.values()) if (stop) stop();
  };
}
