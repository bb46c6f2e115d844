package ipc

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// scopeSet is a set of keel.Scopes, one bit each.
type scopeSet uint8

func scopeBit(name string) (scopeSet, bool) {
	i := slices.Index(keel.Scopes, name)
	if i < 0 {
		return 0, false
	}
	return 1 << i, true
}

// allScopes is every scope: the daemon's own token's.
var allScopes = func() scopeSet {
	var s scopeSet
	for _, name := range keel.Scopes {
		b, _ := scopeBit(name)
		s |= b
	}
	return s
}()

// sessionScopes are a console session's: all but admin.
var sessionScopes = func() scopeSet {
	b, _ := scopeBit(keel.ScopeAdmin)
	return allScopes &^ b
}()

// parseScopes returns the set of names, all of which must be scopes.
func parseScopes(names []string) (scopeSet, error) {
	var s scopeSet
	for _, n := range names {
		b, ok := scopeBit(n)
		if !ok {
			return 0, fmt.Errorf("unknown scope %q (want %v)", n, keel.Scopes)
		}
		s |= b
	}
	return s, nil
}

func (s scopeSet) has(name string) bool {
	b, ok := scopeBit(name)
	return ok && s&b != 0
}

// names returns the scopes of s in the order of keel.Scopes.
func (s scopeSet) names() []string {
	out := []string{}
	for _, n := range keel.Scopes {
		if s.has(n) {
			out = append(out, n)
		}
	}
	return out
}

// methodScopes maps every method to the scope a caller needs for it
// ("" for initialize, which every caller may call). A method missing
// here needs admin (scopeOf); TestEveryMethodHasAScope keeps it
// complete.
var methodScopes = map[string]string{
	protocol.MethodInitialize: "",

	protocol.MethodRunList:         keel.ScopeRead,
	protocol.MethodRunGet:          keel.ScopeRead,
	protocol.MethodRunSubscribe:    keel.ScopeRead,
	protocol.MethodRunUnsubscribe:  keel.ScopeRead,
	protocol.MethodRunsSubscribe:   keel.ScopeRead,
	protocol.MethodRunsUnsubscribe: keel.ScopeRead,
	protocol.MethodToolsList:       keel.ScopeRead,
	protocol.MethodToolsAudit:      keel.ScopeRead,
	protocol.MethodEnvDescribe:     keel.ScopeRead,
	protocol.MethodModelsList:      keel.ScopeRead,
	protocol.MethodPolicyShow:      keel.ScopeRead,
	protocol.MethodPolicyExplain:   keel.ScopeRead,

	protocol.MethodRunStart:    keel.ScopeRun,
	protocol.MethodRunSay:      keel.ScopeRun,
	protocol.MethodRunPause:    keel.ScopeRun,
	protocol.MethodRunResume:   keel.ScopeRun,
	protocol.MethodRunCancel:   keel.ScopeRun,
	protocol.MethodRunFork:     keel.ScopeRun,
	protocol.MethodRunReplay:   keel.ScopeRun,
	protocol.MethodRunTakeOver: keel.ScopeRun,
	protocol.MethodRunHandBack: keel.ScopeRun,
	protocol.MethodRunTool:     keel.ScopeRun,
	protocol.MethodToolsCall:   keel.ScopeRun,
	protocol.MethodModelsChat:  keel.ScopeRun,

	protocol.MethodRunApprove:    keel.ScopeApprove,
	protocol.MethodRunDecide:     keel.ScopeApprove,
	protocol.MethodRunDeclassify: keel.ScopeApprove,

	protocol.MethodToolsInspect: keel.ScopeTools,
	protocol.MethodToolsInstall: keel.ScopeTools,
	protocol.MethodToolsRemove:  keel.ScopeTools,
	protocol.MethodToolsGrant:   keel.ScopeTools,
	protocol.MethodToolsRevoke:  keel.ScopeTools,

	protocol.MethodKnowledgeSearch: keel.ScopeRead,
	protocol.MethodKnowledgeList:   keel.ScopeRead,

	protocol.MethodKnowledgeAdd:      keel.ScopeKnowledge,
	protocol.MethodKnowledgeRemember: keel.ScopeKnowledge,
	protocol.MethodKnowledgeForget:   keel.ScopeKnowledge,
	protocol.MethodKnowledgeWatch:    keel.ScopeKnowledge,
	protocol.MethodKnowledgeUnwatch:  keel.ScopeKnowledge,
	protocol.MethodKnowledgeLabels:   keel.ScopeKnowledge,

	protocol.MethodModelsPull:   keel.ScopeAdmin,
	protocol.MethodConsoleLogin: keel.ScopeAdmin,
	protocol.MethodTokenCreate:  keel.ScopeAdmin,
	protocol.MethodTokenList:    keel.ScopeAdmin,
	protocol.MethodTokenRevoke:  keel.ScopeAdmin,
}

// scopeOf returns the scope method needs.
func scopeOf(method string) string {
	if s, ok := methodScopes[method]; ok {
		return s
	}
	return keel.ScopeAdmin
}

// forbidden is the error of a method outside the caller's scopes.
func forbidden(method, scope string) *protocol.Error {
	data, _ := json.Marshal(protocol.ForbiddenData{Method: method, Scope: scope})
	return &protocol.Error{
		Code:    protocol.CodeForbidden,
		Message: fmt.Sprintf("%s needs the %q scope, which this connection's token does not have", method, scope),
		Data:    data,
	}
}
