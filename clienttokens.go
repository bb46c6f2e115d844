package keel

import "time"

// Scopes of a client token: what the protocol methods it may call do
// (docs/protocol.md#scopes). The daemon's own token has them all; a
// console session all but ScopeAdmin.
const (
	ScopeRead    = "read"    // list and read runs, tools, models, policy, the environment; follow runs
	ScopeRun     = "run"     // start, steer and stop runs; call tools and models
	ScopeApprove = "approve" // answer approvals and decisions, declassify
	ScopeTools   = "tools"   // install, remove, inspect tools; grant and revoke their grants
	// ScopeKnowledge: add to, watch and forget from the knowledge store
	// (searching and listing it is ScopeRead).
	ScopeKnowledge = "knowledge"
	ScopeAdmin     = "admin" // client tokens, console logins, model downloads
)

// Scopes lists every scope, in order of reach.
var Scopes = []string{ScopeRead, ScopeRun, ScopeApprove, ScopeTools, ScopeKnowledge, ScopeAdmin}

// ClientToken is a per-client token the daemon accepts beside its own:
// named, limited to scopes and, in browsers, to origin patterns, and
// revocable. Only the SHA-256 of the secret is kept.
type ClientToken struct {
	Name string `json:"name"`
	// SHA256 is the hex SHA-256 of the secret; never sent to clients.
	SHA256  string    `json:"-"`
	Scopes  []string  `json:"scopes"`
	Origins []string  `json:"origins"` // origin patterns of the pages that may use it; [] for none
	Created time.Time `json:"created_at"`
	// Expires is when it stops working; zero for never.
	Expires time.Time `json:"expires_at,omitzero"`
	// LastUsed is when a connection last authenticated with it (to
	// about a minute); zero for never.
	LastUsed time.Time `json:"last_used_at,omitzero"`
}
