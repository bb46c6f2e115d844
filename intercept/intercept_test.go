package intercept_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
)

// recorder is an interceptor that logs its hooks and answers Before
// with a fixed decision.
type recorder struct {
	name string
	d    intercept.Decision
	log  *[]string
}

func (r recorder) BeforeTool(_ context.Context, inv keel.ToolInvocation) intercept.Decision {
	*r.log = append(*r.log, r.name+" before "+inv.Name)
	return r.d
}

func (r recorder) AfterTool(_ context.Context, inv keel.ToolInvocation, d intercept.Decision, o intercept.ToolOutcome) {
	*r.log = append(*r.log, fmt.Sprintf("%s after %s deny=%v by=%s reason=%s out=%s err=%v", r.name, inv.Name, d.Deny, d.By, d.Reason, o.Output, o.Err))
}

func (r recorder) BeforeModel(_ context.Context, inv keel.ModelInvocation) intercept.Decision {
	*r.log = append(*r.log, r.name+" before "+inv.Model)
	return r.d
}

func (r recorder) AfterModel(_ context.Context, inv keel.ModelInvocation, d intercept.Decision, o intercept.ModelOutcome) {
	*r.log = append(*r.log, fmt.Sprintf("%s after %s deny=%v by=%s reason=%s model=%s err=%v", r.name, inv.Model, d.Deny, d.By, d.Reason, o.Model, o.Err))
}

func TestToolsOrder(t *testing.T) {
	t.Parallel()
	deny := intercept.Decision{Deny: true, By: "policy", Reason: "not today"}
	explain := intercept.Decision{Reason: "rule 3 allows it"}
	tests := []struct {
		name      string
		decisions []intercept.Decision
		want      []string
		wantRan   bool
	}{
		{"none", nil, []string{"call"}, true},
		{"all allow", []intercept.Decision{{}, {}}, []string{
			"a before t", "b before t", "call",
			"b after t deny=false by= reason= out={} err=<nil>",
			"a after t deny=false by= reason= out={} err=<nil>"}, true},
		{"an allow explains itself", []intercept.Decision{explain, {}}, []string{
			"a before t", "b before t", "call",
			"b after t deny=false by= reason=rule 3 allows it out={} err=<nil>",
			"a after t deny=false by= reason=rule 3 allows it out={} err=<nil>"}, true},
		{"the second denies", []intercept.Decision{{}, deny, {}}, []string{
			"a before t", "b before t",
			"c after t deny=true by=policy reason=not today out= err=permission_denied: the call of t was denied by policy: not today",
			"b after t deny=true by=policy reason=not today out= err=permission_denied: the call of t was denied by policy: not today",
			"a after t deny=true by=policy reason=not today out= err=permission_denied: the call of t was denied by policy: not today"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log []string
			var chain intercept.Tools
			for i, d := range tt.decisions {
				chain = append(chain, recorder{name: string(rune('a' + i)), d: d, log: &log})
			}
			ran := false
			o := chain.Call(context.Background(), keel.ToolInvocation{Name: "t"}, func(context.Context) intercept.ToolOutcome {
				ran = true
				log = append(log, "call")
				return intercept.ToolOutcome{Output: json.RawMessage(`{}`)}
			})
			if diff := cmp.Diff(tt.want, log); diff != "" {
				t.Errorf("hooks (-want +got):\n%s", diff)
			}
			if ran != tt.wantRan {
				t.Errorf("call ran = %v, want %v", ran, tt.wantRan)
			}
			if o.Start.IsZero() {
				t.Errorf("outcome has no start time")
			}
			if !tt.wantRan && (o.Err == nil || o.Err.Code != keel.ToolPermissionDenied) {
				t.Errorf("outcome of a denied call = %v, want permission_denied", o.Err)
			}
		})
	}
}

func TestModelsOrder(t *testing.T) {
	t.Parallel()
	var log []string
	chain := intercept.Models{
		recorder{name: "a", log: &log},
		recorder{name: "b", d: intercept.Decision{Deny: true, By: "policy", Reason: "private run"}, log: &log},
		recorder{name: "c", log: &log},
	}
	o := chain.Call(context.Background(), keel.ModelInvocation{Model: "m"}, func(context.Context) intercept.ModelOutcome {
		t.Error("a denied call ran")
		return intercept.ModelOutcome{}
	})
	var de *intercept.DeniedError
	if !errors.As(o.Err, &de) || !errors.Is(o.Err, intercept.ErrDenied) || de.Decision.By != "policy" {
		t.Errorf("outcome error = %v, want a DeniedError by policy", o.Err)
	}
	want := []string{"a before m", "b before m",
		"c after m deny=true by=policy reason=private run model= err=denied by policy: private run",
		"b after m deny=true by=policy reason=private run model= err=denied by policy: private run",
		"a after m deny=true by=policy reason=private run model= err=denied by policy: private run"}
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("hooks (-want +got):\n%s", diff)
	}

	log = nil
	chain = chain[:1]
	o = chain.Call(context.Background(), keel.ModelInvocation{Model: "m"}, func(context.Context) intercept.ModelOutcome {
		return intercept.ModelOutcome{Model: "m:7b"}
	})
	if o.Err != nil || o.Model != "m:7b" || !slices.Equal(log, []string{"a before m", "a after m deny=false by= reason= model=m:7b err=<nil>"}) {
		t.Errorf("allowed call: outcome %+v, hooks %q", o, log)
	}
}
