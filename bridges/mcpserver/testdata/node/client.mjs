// keel's tools through the official MCP TypeScript SDK client, over the
// transport KEEL_MCP_TRANSPORT names:
//   http:  KEEL_MCP_URL with "Authorization: Bearer $KEEL_MCP_TOKEN"
//   stdio: the command in KEEL_MCP_COMMAND (a JSON array), keel mcp
// It lists the tools, calls wordcount, gets a schema error and a
// permission denial, then prints "ready for a change" and waits until a
// tools/list_changed notification shows writefile installed (the Go test
// installs it). Any mismatch exits 1 saying what; success prints "ok".
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
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

const client = new Client({ name: 'keel-ts-test', version: '1.0.0' });
let changed = () => {};
client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed());
await client.connect(transport);

const { tools } = await client.listTools();
const wc = tools.find((t) => t.name === 'wordcount');
assert.ok(wc, `tools/list has no wordcount: ${tools.map((t) => t.name)}`);
assert.deepEqual(wc.inputSchema.required, ['text'], 'wordcount inputSchema');
assert.equal(wc.outputSchema?.type, 'object', 'wordcount outputSchema');
assert.equal(wc.annotations?.readOnlyHint, true, 'wordcount readOnlyHint');
assert.equal(wc.annotations?.destructiveHint, false, 'wordcount destructiveHint');
assert.ok(tools.find((t) => t.name === 'readfile'), 'tools/list has no readfile');

// A call: the SDK checks structuredContent against wordcount's outputSchema.
const ok = await client.callTool({ name: 'wordcount', arguments: { text: 'one two\nthree' } });
assert.ok(!ok.isError, `wordcount failed: ${JSON.stringify(ok)}`);
assert.deepEqual(ok.structuredContent, { words: 3, lines: 2, chars: 13 });

// A schema error: isError, keel's tool error in _meta.
const bad = await client.callTool({ name: 'wordcount', arguments: { text: 5 } });
assert.equal(bad.isError, true, `wordcount {text: 5}: ${JSON.stringify(bad)}`);
assert.equal(bad._meta?.['keel/error']?.code, 'invalid_input');
assert.equal(bad._meta?.['keel/error']?.path, '/text');
assert.match(bad.content[0].text, /^invalid_input: \/text: /);

// A permission denial: readfile holds no grant for its directory.
const denied = await client.callTool({ name: 'readfile', arguments: { path: 'notes.txt' } });
assert.equal(denied.isError, true, `readfile: ${JSON.stringify(denied)}`);
assert.equal(denied._meta?.['keel/error']?.code, 'permission_denied');

// A change of the installed tools.
const installed = new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('no tools/list_changed showing writefile within 120 s')), 120_000);
  changed = async () => {
    const { tools } = await client.listTools();
    if (tools.some((t) => t.name === 'writefile')) {
      clearTimeout(timer);
      resolve();
    }
  };
});
console.log('ready for a change');
await installed;
await client.close();
console.log('ok');
