// A native MCP server for keel's MCP benchmark (bench/mcp): one tool,
// wordcount, doing what keel's example wordcount tool does (words are
// runs of non-space characters; lines count a final line without a
// newline; chars are code points), on the official TypeScript SDK.
//
//   node server.mjs stdio   serve on stdin/stdout
//   node server.mjs http    serve streamable HTTP on a free loopback
//                           port and print its URL on stdout
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

function count(text) {
  let words = 0, lines = 0, chars = 0, inWord = false;
  for (const ch of text) {
    chars++;
    if (ch === '\n') lines++;
    if (/\s/u.test(ch)) inWord = false;
    else if (!inWord) { inWord = true; words++; }
  }
  if (text.length > 0 && !text.endsWith('\n')) lines++;
  return { words, lines, chars };
}

function newServer() {
  const server = new McpServer({ name: 'node-wordcount', version: '1.0.0' });
  server.registerTool('wordcount', {
    description: 'Count the words, lines and characters of a text.',
    inputSchema: { text: z.string() },
    outputSchema: { words: z.number().int(), lines: z.number().int(), chars: z.number().int() },
    annotations: { readOnlyHint: true },
  }, async ({ text }) => {
    const out = count(text);
    return { content: [{ type: 'text', text: JSON.stringify(out) }], structuredContent: out };
  });
  return server;
}

if (process.argv[2] === 'http') {
  const sessions = {};
  const srv = http.createServer(async (req, res) => {
    const id = req.headers['mcp-session-id'];
    let t = id && sessions[id];
    if (!t) {
      t = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), onsessioninitialized: (sid) => { sessions[sid] = t; } });
      await newServer().connect(t);
    }
    await t.handleRequest(req, res);
  });
  srv.listen(0, '127.0.0.1', () => console.log(`http://127.0.0.1:${srv.address().port}/mcp`));
} else {
  await newServer().connect(new StdioServerTransport());
}
