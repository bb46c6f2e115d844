// node:fs with a globSync stand-in, for the conformance suite on Node 20
// (see harness.mjs).
import fs from 'node:fs';
export * from 'node:fs';
export default fs;
export function globSync() {
  throw new Error('fs.globSync needs Node 22 or later');
}
