package policy

import (
	"strings"
	"testing"
)

// TestKnowledgeOwnScopes: with nothing to say about a knowledge scope,
// a reader may read its own scopes (Action.Own) and no other; a rule
// allows another, and a layer's default or a rule can deny its own.
func TestKnowledgeOwnScopes(t *testing.T) {
	t.Parallel()
	none := compile(t, file(LayerUser, `{}`))
	allowUser := compile(t, file(LayerUser, `{"rules": [{"action": "knowledge", "scope": "user", "decision": "allow"}]}`))
	denyAll := compile(t, file(LayerUser, `{"default": {"knowledge": "deny"}}`))
	denyWS := compile(t, file(LayerManaged, `{"rules": [{"action": "knowledge", "scope": "workspace:/home/ada/*", "decision": "deny"}]}`),
		file(LayerUser, `{"rules": [{"action": "knowledge", "scope": "user", "decision": "allow"}]}`))
	for _, tt := range []struct {
		name  string
		p     *Policy
		scope string
		own   bool
		want  Outcome
		why   string
	}{
		{"own workspace", none, "workspace:/home/ada/proj", true, Allow, "a run may read its own scopes"},
		{"user, no rule", none, "user", false, Deny, "a run reads only its own scopes"},
		{"another workspace", none, "workspace:/home/ada/other", false, Deny, "a run reads only its own scopes"},
		{"user allowed", allowUser, "user", false, Allow, "rule 1 of the user layer"},
		{"another still denied", allowUser, "workspace:/x", false, Deny, "a run reads only its own scopes"},
		{"own, default deny", denyAll, "run:run_1", true, Deny, "default.knowledge"},
		{"own, managed deny", denyWS, "workspace:/home/ada/proj", true, Deny, "rule 1 of the managed layer"},
		{"user under managed", denyWS, "user", false, Allow, "rule 1 of the user layer"},
	} {
		d := tt.p.Decide(&Action{Kind: KindKnowledge, Scope: tt.scope, Own: tt.own})
		if d.Outcome != tt.want || !strings.Contains(d.String(), tt.why) {
			t.Errorf("%s: Decide(knowledge %s, own %v) = %s, want %s (%s)", tt.name, tt.scope, tt.own, d, tt.want, tt.why)
		}
	}
}
