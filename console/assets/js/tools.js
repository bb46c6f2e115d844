// Tools: what is installed, what each requests and is granted (grant and
// revoke here, as `keel tools grant/revoke` do), and the audit trail of
// calls. tools.changed notifications refresh the list.

import { h, replace, errorText, alertBox, say, fmtTime, fmtDur, table } from './dom.js';

// grantText lists a Grants object as short lines ("fs /data → /home/x (ro)").
function grantEntries(g) {
  const out = [];
  for (const f of g?.fs || []) {
    out.push({ text: `fs ${f.guest_path}${f.host_path ? ' ← ' + f.host_path : ''} (${f.read_only ? 'read-only' : 'read-write'}${f.private ? ', private' : ''}${(f.labels || []).map((l) => ', label ' + l).join('')})`, revoke: { fs: [{ host_path: f.host_path || '', guest_path: f.guest_path }] } });
  }
  for (const n of g?.network || []) out.push({ text: `network ${n}`, revoke: { network: [n] } });
  for (const e of g?.env || []) out.push({ text: `env ${e}`, revoke: { env: [e] } });
  for (const [k, v] of Object.entries(g?.limits || {})) if (v) out.push({ text: `limit ${k} ${v}`, revoke: { limits: { [k]: v } } });
  return out;
}

function toolCard(conn, t, refresh) {
  const box = alertBox();
  const act = async (what, method, params) => {
    try {
      await conn.call(method, { name: t.name, ...params });
      say(box, `${what}: done.`, true);
      refresh();
    } catch (e) {
      say(box, `${what} failed: ${errorText(e)}`, false);
    }
  };
  const granted = grantEntries(t.grants);
  const requested = grantEntries(t.requests);
  const pre = `grant-${t.name}`.replace(/[^A-Za-z0-9_-]/g, '_');
  const kind = h('select', { id: pre + '-kind' }, ['fs', 'network', 'env'].map((k) => h('option', { value: k }, k)));
  const guest = h('input', { type: 'text', id: pre + '-guest', placeholder: 'guest path, e.g. /workspace' });
  const host = h('input', { type: 'text', id: pre + '-host', placeholder: 'host directory (absolute)' });
  const ro = h('input', { type: 'checkbox', id: pre + '-ro', checked: true });
  const value = h('input', { type: 'text', id: pre + '-value', placeholder: 'https://host:443 or NAME' });
  const fsFields = h('span', { class: 'fs-fields' },
    h('label', { for: pre + '-guest' }, 'Guest path'), guest, h('label', { for: pre + '-host' }, 'Host directory'), host,
    h('label', { for: pre + '-ro' }, ro, ' read-only'));
  const otherFields = h('span', { hidden: true }, h('label', { for: pre + '-value' }, 'Pattern or name'), value);
  kind.addEventListener('change', () => { fsFields.hidden = kind.value !== 'fs'; otherFields.hidden = kind.value === 'fs'; });
  const grantForm = h('form', { class: 'row', onsubmit: (e) => {
    e.preventDefault();
    const grants = kind.value === 'fs'
      ? { fs: [{ host_path: host.value.trim(), guest_path: guest.value.trim(), read_only: ro.checked }] }
      : { [kind.value]: [value.value.trim()] };
    act('Grant', 'tools.grant', { grants });
  } }, h('label', { for: pre + '-kind' }, 'Grant'), kind, fsFields, otherFields, h('button', { type: 'submit' }, 'Grant'));

  return h('article', { class: 'card tool', 'data-tool': t.name },
    h('h3', {}, t.name, h('span', { class: 'muted' }, ` ${t.version || ''}`), t.compiling ? ' (compiling)' : ''),
    h('p', {}, t.description || ''),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Side effects'), h('dd', {}, t.side_effects || 'unknown'),
      h('dt', {}, 'Requests'), h('dd', {}, requested.length ? requested.map((r) => r.text).join('; ') : 'nothing'),
      t.labels?.length ? [h('dt', {}, 'Output labels'), h('dd', {}, t.labels.join(', '))] : null,
      h('dt', {}, 'Module'), h('dd', {}, h('code', {}, (t.sha256 || '').slice(0, 16)))),
    h('h4', {}, 'Grants'),
    granted.length ? h('ul', { class: 'grants' }, granted.map((g) => h('li', {}, g.text, ' ',
      h('button', { type: 'button', class: 'small', onclick: () => act(`Revoke ${g.text}`, 'tools.revoke', { grants: g.revoke }) }, 'Revoke'))))
      : h('p', {}, 'None: calls that need a request fail with permission_denied.'),
    t.pending_grants ? h('p', {}, 'Grants given to an earlier version wait for confirmation. ',
      h('button', { type: 'button', onclick: () => act('Confirm grants', 'tools.grant', { grants: {}, confirm: t.grant_digest }) }, 'Confirm them')) : null,
    granted.length ? h('button', { type: 'button', onclick: () => act('Revoke all', 'tools.revoke', { all: true }) }, 'Revoke all') : null,
    grantForm, box);
}

export function toolsPage(conn, root) {
  const list = h('div', { id: 'tools' });
  const audit = h('div', { id: 'audit' });
  const note = h('p', { class: 'muted', 'aria-live': 'polite' }, 'Loading…');
  replace(root, h('h1', {}, 'Tools'), note, list,
    h('section', { 'aria-labelledby': 'audit-h' }, h('h2', { id: 'audit-h' }, 'Audit: the last 50 calls'), audit));
  async function refresh() {
    try {
      const res = await conn.call('tools.list');
      note.textContent = `${res.tools.length} tools installed.` + (res.compiling ? ` Compiling: ${res.compiling.loaded} of ${res.compiling.total} loaded.` : '');
      replace(list, res.tools.map((t) => toolCard(conn, t, refresh)));
      const { records } = await conn.call('tools.audit', { limit: 50 });
      replace(audit, records.length === 0 ? h('p', {}, 'No calls yet.') : table(null,
        ['Time', 'Tool', 'Run', 'Outcome', 'Duration', 'Policy'],
        records.map((r) => [fmtTime(r.time), r.tool,
          r.run_id ? h('a', { href: `#/runs/${encodeURIComponent(r.run_id)}` }, `${r.run_id} ${r.call_id || ''}`) : 'direct',
          r.outcome + (r.error ? ': ' + r.error : ''), fmtDur(r.duration_ns || 0), r.policy ? r.policy.explanation || r.policy.outcome : ''])));
    } catch (e) {
      if (conn.state === 'open') note.textContent = 'Could not list the tools: ' + errorText(e);
    }
  }
  const onChange = () => refresh();
  const onOpen = (e) => { if (e.detail.state === 'open') refresh(); };
  conn.addEventListener('tools.changed', onChange);
  conn.addEventListener('state', onOpen);
  refresh();
  return () => { conn.removeEventListener('tools.changed', onChange); conn.removeEventListener('state', onOpen); };
}
