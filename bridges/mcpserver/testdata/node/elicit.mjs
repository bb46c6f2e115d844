// keel's policy asks (MCP elicitation) through the official MCP
// TypeScript SDK client, over the transport KEEL_MCP_TRANSPORT names (as
// client.mjs). The policy asks before each call of stamp and denies
// stamp {note: "forbidden"}. A client declaring elicitation accepts the
// call {note: "yes"} and declines {note: "no"}; a client declaring none
// is refused with policy_denied. Names: KEEL_MCP_NAME and
// KEEL_MCP_NAME-plain. Any mismatch exits 1 saying what; success prints
// "ok".
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import assert from 'node:assert/strict';

const env = process.env;
function transport() {
  if (env.KEEL_MCP_TRANSPORT === 'http') {
    return new StreamableHTTPClientTransport(new URL(env.KEEL_MCP_URL), {
      requestInit: { headers: { Authorization: 'Bearer ' + env.KEEL_MCP_TOKEN } },
    });
  }
  const [command, ...args] = JSON.parse(env.KEEL_MCP_COMMAND);
  return new StdioClientTransport({ command, args, env: { ...env }, stderr: 'inherit' });
}

const asked = [];
const client = new Client({ name: env.KEEL_MCP_NAME, version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } });
client.setRequestHandler(ElicitRequestSchema, (req) => {
  const msg = req.params.message;
  asked.push(msg);
  assert.match(msg, /Tool: stamp/, 'the question names the tool');
  if (msg.includes('{"note":"yes"}')) return { action: 'accept', content: {} };
  assert.match(msg, /\{"note":"no"\}/, 'the question shows the exact arguments');
  return { action: 'decline' };
});
await client.connect(transport());

const yes = await client.callTool({ name: 'stamp', arguments: { note: 'yes' } });
assert.ok(!yes.isError, `approved stamp failed: ${JSON.stringify(yes)}`);
assert.deepEqual(yes.structuredContent, { stamped: true });

const no = await client.callTool({ name: 'stamp', arguments: { note: 'no' } });
assert.equal(no.isError, true, `declined stamp ran: ${JSON.stringify(no)}`);
assert.equal(no._meta?.['keel/error']?.code, 'denied');

const forbidden = await client.callTool({ name: 'stamp', arguments: { note: 'forbidden' } });
assert.equal(forbidden._meta?.['keel/error']?.code, 'policy_denied', `forbidden: ${JSON.stringify(forbidden)}`);
assert.equal(asked.length, 2, `asked ${asked.length} times, want 2 (a denied call is not asked about)`);
await client.close();

const plain = new Client({ name: env.KEEL_MCP_NAME + '-plain', version: '1.0.0' });
await plain.connect(transport());
const refused = await plain.callTool({ name: 'stamp', arguments: { note: 'yes' } });
assert.equal(refused.isError, true, `stamp ran without a way to ask: ${JSON.stringify(refused)}`);
assert.equal(refused._meta?.['keel/error']?.code, 'policy_denied');
assert.match(refused.content[0].text, /elicitation/);
await plain.close();
console.log('ok');
