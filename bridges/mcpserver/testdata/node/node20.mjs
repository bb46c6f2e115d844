// Lets the conformance suite (which imports fs.globSync, new in Node 22)
// run on Node 20: node --import ./node20.mjs. On Node 22 and later it
// does nothing. The suite's server scenarios never call globSync (only
// its tier report does), so the stand-in only says it is missing.
import * as fs from 'node:fs';
import { register } from 'node:module';

if (!('globSync' in fs)) {
  register('data:text/javascript,' + encodeURIComponent(`
    export async function resolve(spec, ctx, next) {
      if ((spec === 'fs' || spec === 'node:fs') && ctx.parentURL && ctx.parentURL.includes('/@modelcontextprotocol/conformance/')) {
        return { url: ${JSON.stringify(new URL('./fs-node20.mjs', import.meta.url).href)}, shortCircuit: true };
      }
      return next(spec, ctx);
    }`));
}
