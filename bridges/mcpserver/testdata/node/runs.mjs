// keel's runs over MCP through the official MCP TypeScript SDK client,
// over the transport KEEL_MCP_TRANSPORT names (as client.mjs). The
// daemon's policy allows keel_run_start for goals "allowed: ..." and
// reading traces. It starts a run, reads its trace resource, is refused
// a run the policy does not allow and a trace of no run. It prints
// "run ID" for the Go test; any mismatch exits 1 saying what; success
// prints "ok".
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import assert from 'node:assert/strict';

const env = process.env;
let transport;
if (env.KEEL_MCP_TRANSPORT === 'http') {
  transport = new StreamableHTTPClientTransport(new URL(env.KEEL_MCP_URL), {
    requestInit: { headers: { Authorization: 'Bearer ' + env.KEEL_MCP_TOKEN } },
  });
} else {
  const [command, ...args] = JSON.parse(env.KEEL_MCP_COMMAND);
  transport = new StdioClientTransport({ command, args, env: { ...env }, stderr: 'inherit' });
}
const client = new Client({ name: 'keel-ts-runs', version: '1.0.0' });
await client.connect(transport);

const { tools } = await client.listTools();
const start = tools.find((t) => t.name === 'keel_run_start');
assert.ok(start, `tools/list has no keel_run_start: ${tools.map((t) => t.name)}`);
assert.deepEqual(start.inputSchema.required, ['goal']);
const { resourceTemplates } = await client.listResourceTemplates();
assert.ok(resourceTemplates.some((t) => t.uriTemplate === 'keel://runs/{id}/trace'), `templates: ${JSON.stringify(resourceTemplates)}`);

const started = await client.callTool({ name: 'keel_run_start', arguments: { goal: 'allowed: say hello' } });
assert.ok(!started.isError, `keel_run_start: ${JSON.stringify(started)}`);
const id = started.structuredContent.run_id;
assert.match(id, /^run_/);
assert.equal(started.structuredContent.trace, `keel://runs/${id}/trace`);
console.log('run ' + id);

const read = await client.readResource({ uri: `keel://runs/${id}/trace` });
assert.equal(read.contents[0].mimeType, 'application/json');
const trace = JSON.parse(read.contents[0].text);
assert.equal(trace.run_id, id);
assert.ok(Array.isArray(trace.spans), `trace: ${read.contents[0].text}`);

const refused = await client.callTool({ name: 'keel_run_start', arguments: { goal: 'something else' } });
assert.equal(refused.isError, true, `a run the policy does not allow started: ${JSON.stringify(refused)}`);
assert.equal(refused._meta?.['keel/error']?.code, 'policy_denied');
assert.match(refused.content[0].text, /off unless the policy allows/);

await assert.rejects(client.readResource({ uri: 'keel://runs/run_nope/trace' }), /not found/i);
await client.close();
console.log('ok');
