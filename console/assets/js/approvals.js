// The approvals inbox: every tool call a run waits on a person for. An
// approval.requested is answered with run.approve (approve, with the
// arguments as they are or edited, or deny with a reason); a run.waiting
// (a call whose outcome is unknown) with run.decide (retry, skip, done).
//
// The inbox is live: it learns which runs wait from run.list once and
// then from runs.changed, and follows each waiting run's events
// (run.subscribe), so a call answered anywhere (another browser, the
// command line) leaves the inbox as its decision is journaled. Nothing
// polls.

import { h, replace, json, errorText, alertBox, say } from './dom.js';
import { watchRuns, newer } from './rpc.js';

// applyWait folds one event into open, the waits a run's events leave
// unanswered (call id -> wait): approval requests without an
// approval.decision, waits without a human.decision.
function applyWait(open, ev) {
  const d = ev.data || {};
  if (ev.type === 'approval.requested') open.set(d.call.id, { kind: 'approval', seq: ev.seq, data: d });
  else if (ev.type === 'run.waiting' && d.call) open.set(d.call.id, { kind: 'waiting', seq: ev.seq, data: d });
  else if (ev.type === 'approval.decision' || ev.type === 'human.decision') open.delete(d.call_id);
  else if (['run.succeeded', 'run.failed', 'run.cancelled'].includes(ev.type)) open.clear();
}

// openWaits returns what a run's events leave unanswered.
export function openWaits(events) {
  const open = new Map();
  for (const ev of events) applyWait(open, ev);
  return [...open.values()];
}

// waitCard is the form answering one wait of a run; onDone runs after
// the daemon accepted the answer.
export function waitCard(conn, run, wait, onDone) {
  const call = wait.data.call;
  const box = alertBox();
  const head = h('h3', {}, `${call.name}`, h('span', { class: 'muted' }, ` — call ${call.id}`));
  const meta = h('dl', { class: 'facts' },
    h('dt', {}, 'Run'), h('dd', {}, h('a', { href: `#/runs/${encodeURIComponent(run.id)}` }, run.id), ' ', h('span', { class: 'goal' }, run.goal)),
    wait.data.side_effects ? [h('dt', {}, 'Side effects'), h('dd', {}, wait.data.side_effects)] : null,
    wait.data.policy ? [h('dt', {}, 'Why it asks'), h('dd', {}, wait.data.policy.explanation || wait.data.policy.outcome)] : null,
    wait.data.reason ? [h('dt', {}, 'Why it waits'), h('dd', {}, wait.data.reason)] : null);
  const id = `args-${run.id}-${call.id}`.replace(/[^A-Za-z0-9_-]/g, '_');
  const original = json(call.arguments ?? {});
  const args = h('textarea', { id, rows: Math.min(12, original.split('\n').length + 1), spellcheck: 'false', value: original });
  const card = h('article', { class: 'card wait', 'data-run': run.id, 'data-call': call.id, 'data-kind': wait.kind }, head, meta);
  const answer = async (method, params, what) => {
    for (const b of card.querySelectorAll('button')) b.disabled = true;
    try {
      await conn.call(method, { run_id: run.id, call_id: call.id, ...params });
      say(box, `${what}.`, true);
      card.dataset.answered = 'true';
      if (onDone) onDone();
    } catch (e) {
      say(box, `Not answered: ${errorText(e)}`, false);
      for (const b of card.querySelectorAll('button')) b.disabled = false;
    }
  };
  const parseArgs = () => {
    try { return JSON.parse(args.value); } catch (e) { say(box, `The arguments are not valid JSON: ${e.message}`, false); return undefined; }
  };

  if (wait.kind === 'approval') {
    const reason = h('input', { type: 'text', id: id + '-reason', name: 'reason', placeholder: 'why not' });
    card.append(
      h('label', { for: id }, 'Arguments (JSON; edit them to approve a changed call)'), args,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'approve', onclick: () => {
          const v = parseArgs();
          if (v === undefined) return;
          const edited = JSON.stringify(v) !== JSON.stringify(call.arguments ?? {});
          answer('run.approve', { args_sha256: wait.data.args_sha256, approved: true, ...(edited ? { arguments: v } : {}) },
            edited ? 'Approved with edited arguments' : 'Approved');
        } }, 'Approve'),
        h('label', { for: id + '-reason' }, 'Reason'), reason,
        h('button', { type: 'button', class: 'deny', onclick: () => {
          if (!reason.value.trim()) { say(box, 'Say why you deny it: the model reads the reason.', false); reason.focus(); return; }
          answer('run.approve', { args_sha256: wait.data.args_sha256, approved: false, reason: reason.value.trim() }, 'Denied');
        } }, 'Deny')),
      box);
  } else {
    const note = h('input', { type: 'text', id: id + '-note', placeholder: 'optional' });
    args.value = '';
    args.placeholder = 'its output, as JSON (optional, for "it was done")';
    card.append(
      h('p', {}, 'keel cannot tell whether this call happened. Say what to do.'),
      h('label', { for: id }, 'Output (JSON)'), args,
      h('label', { for: id + '-note' }, 'Note'), note,
      h('div', { class: 'actions' }, (wait.data.choices || ['retry', 'skip', 'done']).map((c) =>
        h('button', { type: 'button', onclick: () => {
          const p = { decision: c, note: note.value.trim() || undefined };
          if (c === 'done' && args.value.trim()) {
            const v = parseArgs();
            if (v === undefined) return;
            p.output = v;
          }
          answer('run.decide', p, `Decided: ${c}`);
        } }, c))),
      box);
  }
  return card;
}

export function approvalsPage(conn, root) {
  const list = h('div', { id: 'inbox' });
  const note = h('p', { class: 'muted', 'aria-live': 'polite' }, 'Loading…');
  replace(root, h('h1', {}, 'Approvals'), note, list);
  // run id -> { run, stop, open: call id -> wait, cards: call id -> card }
  const runs = new Map();
  const tell = () => {
    let n = 0;
    for (const r of runs.values()) n += r.cards.size;
    note.textContent = n ? `${n} waiting for you.` : 'Nothing waits for you.';
  };
  // sync shows the cards of r's open waits and removes the others.
  const sync = (r) => {
    for (const [callID, w] of r.open) {
      if (r.cards.has(callID)) continue;
      const card = waitCard(conn, r.run, w, null);
      r.cards.set(callID, card);
      list.append(card);
    }
    for (const [callID, card] of r.cards) {
      if (!r.open.has(callID)) { card.remove(); r.cards.delete(callID); }
    }
    tell();
  };
  const follow = (run) => {
    const known = runs.get(run.id);
    if (known) { if (newer(known.run, run)) known.run = run; return; }
    const r = { run, open: new Map(), cards: new Map() };
    runs.set(run.id, r);
    r.stop = conn.subscribe(run.id, 0, (ev) => {
      if (ev.seq === 0) return;
      applyWait(r.open, ev);
      sync(r);
    });
  };
  const drop = (id) => {
    const r = runs.get(id);
    if (!r) return;
    r.stop();
    for (const card of r.cards.values()) card.remove();
    runs.delete(id);
    tell();
  };
  async function refresh() {
    try {
      const res = await conn.call('run.list', { status: ['waiting'], limit: 200 });
      const waiting = new Set(res.runs.map((r) => r.id));
      for (const id of [...runs.keys()]) if (!waiting.has(id)) drop(id);
      for (const run of res.runs) follow(run);
      tell();
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not read the runs: ' + errorText(e);
    }
  }
  const stopWatch = watchRuns(conn, refresh, (run) => {
    if (run.status === 'waiting') follow(run);
    else if (runs.has(run.id) && newer(runs.get(run.id).run, run)) drop(run.id);
  });
  return () => {
    stopWatch();
    for (const id of [...runs.keys()]) drop(id);
  };
}

// watchInbox keeps the count of waiting runs beside the nav link, from
// run.list once and runs.changed after: no polling.
export function watchInbox(conn, el) {
  const waiting = new Map(); // run id -> summary
  const show = () => { el.textContent = waiting.size ? `(${waiting.size} waiting)` : ''; };
  watchRuns(conn, async () => {
    try {
      const { runs } = await conn.call('run.list', { status: ['waiting'], limit: 200 });
      waiting.clear();
      for (const r of runs) waiting.set(r.id, r);
      show();
    } catch { /* shown by the page */ }
  }, (run) => {
    const known = waiting.get(run.id);
    if (known && !newer(known, run)) return;
    if (run.status === 'waiting') waiting.set(run.id, run);
    else waiting.delete(run.id);
    show();
  });
}
