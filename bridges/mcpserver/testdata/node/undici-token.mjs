// undici for the conformance suite, whose request() gets keel's token
// (see harness.mjs).
import * as undici from 'undici';
export * from 'undici';

export function request(target, opts = {}) {
  const url = process.env.KEEL_MCP_URL;
  const token = process.env.KEEL_MCP_TOKEN;
  if (url && token && String(target).startsWith(url)) {
    opts = { ...opts, headers: { ...(opts.headers ?? {}), authorization: 'Bearer ' + token } };
  }
  return undici.request(target, opts);
}
