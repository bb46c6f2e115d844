package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestDirectToolCallEgress: a tool called directly (tools.call, in no
// run) obeys the policy's egress rules: with fetch granted three
// loopback servers and a user policy that allows egress to one, asks
// for another and denies the rest, tools.call fetch reaches the allowed
// one, and neither the asked one (a direct call cannot wait for a
// person) nor the denied one receives a byte; the refusals say the
// policy refused, and why.
func TestDirectToolCallEgress(t *testing.T) {
	t.Parallel()
	allowed, asked, denied := newTarget(t), newTarget(t), newTarget(t)
	user := `{"default": {"egress": "deny"}, "rules": [
  {"action": "egress", "tool": "fetch", "url": "` + allowed.srv.URL + `/**", "decision": "allow"},
  {"action": "egress", "tool": "fetch", "url": "` + asked.srv.URL + `/**", "decision": "ask"}
]}`
	e := startEgress(t, egressConfig{local: scripted.New(nil), localModel: scripted.DefaultModel.Name, tools: []string{"fetch"},
		user: user, fetchNet: []string{allowed.grant(), asked.grant(), denied.grant()}})
	waitLoaded(t, e.c)
	fetch := func(url string) error {
		in, _ := json.Marshal(map[string]string{"url": url + "/v1/items"})
		_, err := client.Do(context.Background(), e.c, client.ToolsCall, protocol.ToolsCallParams{Name: "fetch", Input: in})
		return err
	}
	if err := fetch(allowed.srv.URL); err != nil || len(allowed.requests()) != 1 {
		t.Fatalf("tools.call fetch to the allowed server: %v; it received %v, want one request", err, allowed.requests())
	}
	for _, tt := range []struct {
		name string
		tg   *target
		want string // in the error
	}{
		{"asked", asked, "cannot wait"},
		{"denied", denied, "deny"},
	} {
		err := fetch(tt.tg.srv.URL)
		var pe *protocol.Error
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, "refused by the policy") || !strings.Contains(pe.Message, tt.want) {
			t.Errorf("tools.call fetch to the %s server: %v, want refused by the policy (%q)", tt.name, err, tt.want)
		}
		if reqs := tt.tg.requests(); len(reqs) != 0 {
			t.Errorf("the %s server received %v from a direct call", tt.name, reqs)
		}
	}
}
