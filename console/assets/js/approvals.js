// The approvals inbox: every tool call a run waits on a person for. An
// approval.requested is answered with run.approve (approve, with the
// arguments as they are or edited, or deny with a reason); a run.waiting
// (a call whose outcome is unknown) with run.decide (retry, skip, done).

import { h, replace, json, errorText, alertBox, say } from './dom.js';

// openWaits returns what a run's events leave unanswered: approval
// requests without an approval.decision, waits without a human.decision.
export function openWaits(events) {
  const open = new Map();
  for (const ev of events) {
    const d = ev.data || {};
    if (ev.type === 'approval.requested') open.set(d.call.id, { kind: 'approval', seq: ev.seq, data: d });
    else if (ev.type === 'run.waiting' && d.call) open.set(d.call.id, { kind: 'waiting', seq: ev.seq, data: d });
    else if (ev.type === 'approval.decision' || ev.type === 'human.decision') open.delete(d.call_id);
    else if (['run.succeeded', 'run.failed', 'run.cancelled'].includes(ev.type)) open.clear();
  }
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

// waitingRuns lists the runs that wait on a person, with their open waits.
async function waitingRuns(conn) {
  const { runs } = await conn.call('run.list', { status: ['waiting'], limit: 200 });
  const out = [];
  for (const run of runs) {
    const det = await conn.call('run.get', { run_id: run.id });
    const waits = openWaits(det.events);
    if (waits.length) out.push({ run: det.run, waits });
  }
  return out;
}

export function approvalsPage(conn, root) {
  const list = h('div', { id: 'inbox' });
  const note = h('p', { class: 'muted', 'aria-live': 'polite' }, 'Loading…');
  replace(root, h('h1', {}, 'Approvals'), note, list);
  const cards = new Map(); // run/call -> card, kept while open so a form being edited stays
  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const waiting = await waitingRuns(conn);
      const keep = new Set();
      for (const { run, waits } of waiting) {
        for (const w of waits) {
          const key = `${run.id}/${w.data.call.id}`;
          keep.add(key);
          if (!cards.has(key)) {
            const card = waitCard(conn, run, w, refresh);
            cards.set(key, card);
            list.append(card);
          }
        }
      }
      for (const [key, card] of cards) {
        if (!keep.has(key) && !card.contains(document.activeElement)) { card.remove(); cards.delete(key); }
      }
      note.textContent = keep.size ? `${keep.size} waiting for you.` : 'Nothing waits for you.';
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not read the runs: ' + errorText(e);
    } finally {
      busy = false;
    }
  }
  const onOpen = (e) => { if (e.detail.state === 'open') refresh(); };
  conn.addEventListener('state', onOpen);
  refresh();
  const timer = setInterval(refresh, 1500);
  return () => { clearInterval(timer); conn.removeEventListener('state', onOpen); };
}

// watchInbox keeps the count of waiting runs beside the nav link.
export function watchInbox(conn, el) {
  const tick = async () => {
    if (conn.state !== 'open') return;
    try {
      const { runs } = await conn.call('run.list', { status: ['waiting'], limit: 200 });
      el.textContent = runs.length ? `(${runs.length} waiting)` : '';
    } catch { /* shown by the page */ }
  };
  conn.addEventListener('state', tick);
  setInterval(tick, 3000);
}
