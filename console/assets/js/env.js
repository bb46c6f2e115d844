// Models and providers (models.list), and the environment's declaration
// (env.describe): what this runtime says about itself.

import { h, replace, errorText, json, table } from './dom.js';

function providerRows(providers) {
  return providers.map((p) => [p.name, p.kind || '', p.endpoint || '',
    p.reachable ? 'reachable' : h('span', { class: 'err' }, 'unreachable'),
    [p.error || '', p.hint ? h('div', { class: 'muted' }, p.hint) : null]]);
}

function loader(conn, root, title, load) {
  const body = h('div');
  replace(root, h('h1', {}, title), body);
  const refresh = async () => {
    try {
      replace(body, await load());
    } catch (e) {
      if (conn.state === 'open') replace(body, h('p', { role: 'alert' }, `Could not read it: ${errorText(e)}`));
    }
  };
  const onOpen = (e) => { if (e.detail.state === 'open') refresh(); };
  conn.addEventListener('state', onOpen);
  refresh();
  return () => conn.removeEventListener('state', onOpen);
}

export function modelsPage(conn, root) {
  return loader(conn, root, 'Models and providers', async () => {
    const res = await conn.call('models.list');
    return [
      table('Providers', ['Name', 'Kind', 'Endpoint', 'Status', 'Notes'], providerRows(res.providers)),
      res.models.length === 0 ? h('p', {}, 'No models.') : table('Models', ['Model', 'Provider', 'Capabilities', 'Context', 'Family'],
        res.models.map((m) => [m.name, m.provider, (m.capabilities || []).join(', '), m.context_length ? `${m.context_length} tokens` : 'unknown', m.family || ''])),
    ];
  });
}

export function envPage(conn, root) {
  return loader(conn, root, 'Environment', async () => {
    const env = await conn.call('env.describe');
    const row = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
    const lim = env.tool_limits || {};
    return [
      h('dl', { class: 'facts' },
        row('Runtime', `${env.runtime} ${env.version} (protocol ${env.protocol})`),
        row('Data directory', h('code', {}, env.data_dir || '')),
        row('Default model', env.default_model || 'none'),
        row('Network', env.network || ''),
        row('Cloud models', env.allow_cloud ? 'allowed (a run must ask, and hold nothing private)' : 'not allowed'),
        row('Calls that wait for approval', (env.require_approval || []).join(', ') || 'none'),
        row('Policy', env.policy ? `version ${env.policy.version}, ${(env.policy.files || []).join('; ') || 'no files'}${env.policy.error ? ' — error: ' + env.policy.error : ''}` : 'none'),
        env.tools_compiling ? row('Tools compiling', String(env.tools_compiling)) : null),
      table('Model providers', ['Name', 'Kind', 'Endpoint', 'Status', 'Notes'], providerRows(env.providers || [])),
      table('Tools', ['Tool', 'Version', 'Side effects', 'Grants'], (env.tools || []).map((t) => [t.name, t.version || '', t.side_effects || '',
        JSON.stringify(t.grants || {})])),
      table('Tool sandbox limits', ['Limit', 'Value'], Object.entries(lim).map(([k, v]) => [k, String(v)])),
      h('details', {}, h('summary', {}, 'The whole declaration (JSON)'), h('pre', {}, json(env))),
    ];
  });
}
