// Preloaded (node --import ./harness.mjs) into the MCP conformance suite
// when keel's tests run it against keel's /mcp:
//
//  - The suite's clients send no credentials; keel's /mcp needs its
//    token. Every request the suite makes (fetch, and undici's request in
//    the DNS-rebinding scenario) to the URL in KEEL_MCP_URL gets
//    "Authorization: Bearer $KEEL_MCP_TOKEN", and nothing else changes:
//    Host, Origin and the body stay the suite's.
//  - The suite imports fs.globSync, new in Node 22; on Node 20 it gets a
//    stand-in that only says so (the server scenarios never call it; the
//    suite's tier report does).
import * as fs from 'node:fs';
import { register } from 'node:module';

const url = process.env.KEEL_MCP_URL;
const token = process.env.KEEL_MCP_TOKEN;

function withToken(target, headers) {
  const h = new Headers(headers ?? {});
  if (url && token && String(target).startsWith(url) && !h.has('authorization')) {
    h.set('authorization', 'Bearer ' + token);
  }
  return h;
}

const realFetch = globalThis.fetch;
globalThis.fetch = (input, init = {}) => {
  const target = input instanceof Request ? input.url : input;
  const headers = withToken(target, init.headers ?? (input instanceof Request ? input.headers : undefined));
  return realFetch(input, { ...init, headers });
};

const here = (name) => JSON.stringify(new URL(name, import.meta.url).href);
register('data:text/javascript,' + encodeURIComponent(`
  export async function resolve(spec, ctx, next) {
    const fromSuite = ctx.parentURL && ctx.parentURL.includes('/@modelcontextprotocol/conformance/');
    if (fromSuite && spec === 'undici') return { url: ${here('./undici-token.mjs')}, shortCircuit: true };
    if (fromSuite && ${!('globSync' in fs)} && (spec === 'fs' || spec === 'node:fs')) return { url: ${here('./fs-node20.mjs')}, shortCircuit: true };
    return next(spec, ctx);
  }`));
