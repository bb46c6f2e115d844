package protocol

import (
	"encoding/json"
	"time"

	"github.com/keel-runtime/keel"
)

// The knowledge store's methods (docs/knowledge.md, docs/protocol.md).
// Searching and listing need the read scope, the others the knowledge
// scope.
const (
	MethodKnowledgeAdd      = "knowledge.add"
	MethodKnowledgeRemember = "knowledge.remember"
	MethodKnowledgeSearch   = "knowledge.search"
	MethodKnowledgeList     = "knowledge.list"
	MethodKnowledgeForget   = "knowledge.forget"
	MethodKnowledgeWatch    = "knowledge.watch"
	MethodKnowledgeUnwatch  = "knowledge.unwatch"
	MethodKnowledgeLabels   = "knowledge.labels"

	// NotifyKnowledgeAddProgress carries one KnowledgeProgress of a
	// knowledge.add to the connection that asked for it.
	NotifyKnowledgeAddProgress = "knowledge.add.progress"
)

// KnowledgeAddParams indexes files and directories (recursively) into a
// scope: absolute paths on the daemon's machine.
type KnowledgeAddParams struct {
	Paths []string `json:"paths"`
	// Scope is "user", "workspace:ROOT" or "run:ID".
	Scope string `json:"scope"`
	// Labels are given to the scope when this add makes it (see
	// knowledge.labels to change them later).
	Labels []string `json:"labels,omitempty"`
}

// KnowledgeProgress is the params of a knowledge.add.progress
// notification: how far an add is, sent at most every ~100 ms.
type KnowledgeProgress struct {
	ID        json.RawMessage `json:"id"` // the knowledge.add request's id, byte for byte
	Files     int             `json:"files"`
	FilesDone int             `json:"files_done"`
	Chunks    int             `json:"chunks"`
	Embedded  int             `json:"embedded,omitempty"`
	Path      string          `json:"path,omitempty"` // the file being read
}

// KnowledgeSkip is a file an add left out, and why.
type KnowledgeSkip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// KnowledgeAddResult is what an add did.
type KnowledgeAddResult struct {
	Scope     string `json:"scope"`
	Added     int    `json:"added"`
	Updated   int    `json:"updated"`
	Unchanged int    `json:"unchanged"`
	// Forgotten counts the documents under a directory added whose files
	// are gone since (omitted when 0).
	Forgotten int             `json:"forgotten,omitempty"`
	Chunks    int             `json:"chunks"`
	Skipped   []KnowledgeSkip `json:"skipped"`
}

// KnowledgeRememberParams saves a run's outcome (its goal and result or
// error) into a scope, as text later runs can retrieve.
type KnowledgeRememberParams struct {
	RunID keel.RunID `json:"run_id"`
	// Scope defaults to the run's workspace scope, or "user" for a run
	// that names no workspace.
	Scope string `json:"scope,omitempty"`
}

// KnowledgeDoc is one document of the store.
type KnowledgeDoc struct {
	ID      string    `json:"id"`
	Source  string    `json:"source"` // a path, a URL, or keel:run/ID
	Type    string    `json:"type"`
	Scope   string    `json:"scope"`
	Labels  []string  `json:"labels"`
	Hash    string    `json:"hash,omitempty"`
	AddedBy string    `json:"added_by,omitempty"`
	ModTime time.Time `json:"mod_time,omitzero"`
	AddedAt time.Time `json:"added_at,omitzero"`
	Chunks  int       `json:"chunks"`
	Bytes   int64     `json:"bytes"`
}

// KnowledgeSearchParams searches the store.
type KnowledgeSearchParams struct {
	Query string `json:"query"`
	// Scopes to search; empty: every scope.
	Scopes     []string `json:"scopes,omitempty"`
	Limit      int      `json:"limit,omitempty"` // default 8, at most 100
	PathPrefix string   `json:"path_prefix,omitempty"`
	Type       string   `json:"type,omitempty"`
}

// KnowledgeHit is one hit of a search, best first.
type KnowledgeHit struct {
	N          int      `json:"n"`
	Cite       string   `json:"cite"` // "[n] source:start-end"
	Source     string   `json:"source"`
	StartLine  int      `json:"start_line,omitempty"`
	EndLine    int      `json:"end_line,omitempty"`
	Heading    string   `json:"heading,omitempty"`
	Type       string   `json:"type,omitempty"`
	Scope      string   `json:"scope"`
	Labels     []string `json:"labels"`
	Score      float64  `json:"score"`
	BM25Rank   int      `json:"bm25_rank,omitempty"`
	VectorRank int      `json:"vector_rank,omitempty"`
	DocID      string   `json:"doc_id"`
	ChunkID    string   `json:"chunk_id"`
	Text       string   `json:"text"`
}

// KnowledgeSearchResult is the result of knowledge.search.
type KnowledgeSearchResult struct {
	Hits []KnowledgeHit `json:"hits"`
}

// KnowledgeListParams filters knowledge.list.
type KnowledgeListParams struct {
	Scope string `json:"scope,omitempty"` // "": every scope
}

// KnowledgeScope is one scope of the store.
type KnowledgeScope struct {
	Name   string   `json:"name"`
	Labels []string `json:"labels"`
	Docs   int      `json:"docs"`
	Chunks int      `json:"chunks"`
	Bytes  int64    `json:"bytes"`
}

// KnowledgeWatch is a directory the daemon keeps indexed.
type KnowledgeWatch struct {
	Dir    string   `json:"dir"`
	Scope  string   `json:"scope"`
	Labels []string `json:"labels,omitempty"`
	// Error is why the directory is not watched now (it went away, say);
	// the daemon tries again at its next start.
	Error string `json:"error,omitempty"`
}

// KnowledgeListResult is the result of knowledge.list.
type KnowledgeListResult struct {
	Scopes  []KnowledgeScope `json:"scopes"`
	Docs    []KnowledgeDoc   `json:"docs"`
	Watches []KnowledgeWatch `json:"watches"`
}

// KnowledgeForgetParams names what to forget: exactly one of a path
// (a file, or everything under a directory), a document's ID or a whole
// scope.
type KnowledgeForgetParams struct {
	Path  string `json:"path,omitempty"`
	ID    string `json:"id,omitempty"`
	Scope string `json:"scope,omitempty"`
}

// KnowledgeForgetResult says how many documents went.
type KnowledgeForgetResult struct {
	Forgotten int `json:"forgotten"`
}

// KnowledgeWatchParams keeps a directory indexed into a scope.
type KnowledgeWatchParams struct {
	Dir    string   `json:"dir"`
	Scope  string   `json:"scope"`
	Labels []string `json:"labels,omitempty"`
}

// KnowledgeUnwatchParams stops watching a directory (what it indexed
// stays; knowledge.forget it).
type KnowledgeUnwatchParams struct {
	Dir string `json:"dir"`
}

// KnowledgeLabelsParams sets a scope's labels.
type KnowledgeLabelsParams struct {
	Scope  string   `json:"scope"`
	Labels []string `json:"labels"`
}
