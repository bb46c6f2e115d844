// Package knowledge is keel's long-term knowledge: documents (files,
// notes, a run's remembered outcome) cut into chunks, searched by BM25
// and by vector similarity, in scopes that policy decides who may read.
// It lives in the daemon's SQLite file, in tables of its own (prefix
// kn_), opened with its own connections.
//
// Provenance: every document records its source (absolute path, URL or
// keel:run/ID), content hash (SHA-256), modification time, who added it
// and when. Every vector records the embedding model and its digest; a
// vector of another model or digest is not used, and is replaced by the
// next Add or Reembed.
//
// Chunking follows the document's structure: Markdown at headings
// (outside code fences; a chunk's heading is its path of headings), Go at
// top-level declarations with their doc comments (go/parser), other
// source code where a blank line meets brace depth zero, text at blank
// lines. Small neighbours are packed up to about 1500 bytes; a piece over
// 4000 bytes is cut at blank lines, else at line ends.
//
// Full-text search is SQLite FTS5 (built into modernc.org/sqlite) over
// the chunks, an external-content index kept in step by triggers in the
// same transaction as the chunk rows, porter-stemmed, ranked by BM25 with
// headings weighing twice the text. A BM25 search is one statement (the
// best page by bm25() with a LIMIT, SQLite's top-N sort, then the page's
// rows, text and labels); a second runs only when every word found too
// few and any word is asked for. Hybrid ranking fuses the BM25 list and
// the vector list by reciprocal rank fusion (k = 60); the query's
// embedding is asked for first and the BM25 list is made while the
// model computes it. The vector list is of chunk ids alone when only
// scopes filter (every vector of a scope searched passes); after the
// fusion one statement reads the hits returned, chunk, document, text
// and labels, a copied text passed over.
//
// Vector search is held in memory per scope: every vector, normalized.
// Up to 16,384 vectors a query is a dot product with each; a larger set
// is searched in two passes (quant.go): a 2-bit code of each vector
// estimates its similarity by table lookups (in a set of 65,536 or more,
// only for the 32,768 whose signs agree most with the query's, found by
// popcount over a 1-bit code), and the best 2,048 (at
// least 16 per hit wanted) are scored exactly, which finds the exact
// scan's hits with a recall of 0.999-1.0 (TestQuantizedRecall; the
// figures are in docs/PERFORMANCE.md). A write updates a loaded set in
// place; forgetting drops it.
//
// Forgetting really forgets: rows are deleted with secure_delete on (their
// bytes overwritten), the FTS index runs with its secure-delete option (a
// deleted chunk's tokens leave the index at once, no delete markers), and
// the write-ahead log is checkpointed and truncated.
//
// An Index is safe for concurrent use. Writes go through one connection
// in short transactions (a few hundred chunks), so a cancelled or killed
// ingest leaves every file fully indexed or as it was.
package knowledge
