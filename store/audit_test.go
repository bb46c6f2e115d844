package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/store"
)

// denyAll is a policy that denies every call.
type denyAll struct{}

func (denyAll) BeforeTool(context.Context, keel.ToolInvocation) intercept.Decision {
	return intercept.Decision{Deny: true, By: "policy", Reason: "tools are off"}
}
func (denyAll) AfterTool(context.Context, keel.ToolInvocation, intercept.Decision, intercept.ToolOutcome) {
}

// TestAuditTrail: the audit interceptor writes one record per call: a
// direct call's before the call returns, a run's call's in the same
// commit as the run's next journal write (not on its own), and a denied
// call's with who denied it.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	s.SetLazyDelay(time.Hour) // a queued record waits for a write to carry it
	audit := intercept.Tools{s.AuditTrail(nil)}
	build := intercept.ToolBuild{Version: "0.2.0", SHA256: "ab12", Grants: []string{"fs:/workspace=ro"}}
	argsSum := func(args string) string {
		sum := sha256.Sum256([]byte(args))
		return hex.EncodeToString(sum[:])
	}
	newest := func() keel.ToolAudit {
		t.Helper()
		recs, err := s.ToolCalls(ctx, "", 1)
		if err != nil || len(recs) != 1 {
			t.Fatalf("ToolCalls = %+v, %v; want one", recs, err)
		}
		return recs[0]
	}
	ignore := cmp.Options{cmpopts.IgnoreFields(keel.ToolAudit{}, "ID", "Time", "Duration"), cmpopts.EquateEmpty()}

	// A direct call: on disk when Call returns.
	args := `{"path":"notes.txt"}`
	o := audit.Call(ctx, keel.ToolInvocation{Name: "readfile", Args: json.RawMessage(args)}, func(context.Context) intercept.ToolOutcome {
		return intercept.ToolOutcome{Build: build, Output: json.RawMessage(`{"content":"hi"}`)}
	})
	got := newest()
	want := keel.ToolAudit{Tool: "readfile", Version: "0.2.0", SHA256: "ab12", Grants: build.Grants, ArgsSHA256: argsSum(args), Outcome: "ok"}
	if diff := cmp.Diff(want, got, ignore); diff != "" {
		t.Errorf("direct call's record (-want +got):\n%s", diff)
	}
	if !got.Time.Equal(o.Start) || got.Duration != o.Duration {
		t.Errorf("record time %v, duration %v; want the outcome's %v, %v", got.Time, got.Duration, o.Start, o.Duration)
	}

	// A run's call: queued, then committed with the run's next write.
	if err := s.CreateRun(ctx, newRun("run_1")); err != nil {
		t.Fatal(err)
	}
	commits := s.Commits()
	args = `{"text":3}`
	audit.Call(ctx, keel.ToolInvocation{Run: "run_1", Step: 2, CallID: "call_2_1", Name: "wordcount", Args: json.RawMessage(args)}, func(context.Context) intercept.ToolOutcome {
		return intercept.ToolOutcome{Build: build, Err: &keel.ToolError{Code: keel.ToolInvalidInput, Path: "/text", Message: "want a string"}}
	})
	if s.Commits() != commits || newest().Tool != "readfile" {
		t.Fatalf("a run's call's record was committed on its own (%d commits)", s.Commits()-commits)
	}
	if _, err := s.Append(ctx, "run_1", keel.EventToolResult, time.Now(), json.RawMessage(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	if n := s.Commits() - commits; n != 1 {
		t.Errorf("the record and the run's next write took %d commits, want 1", n)
	}
	want = keel.ToolAudit{Tool: "wordcount", Version: "0.2.0", SHA256: "ab12", Grants: build.Grants, RunID: "run_1", Step: 2, CallID: "call_2_1",
		ArgsSHA256: argsSum(args), Outcome: string(keel.ToolInvalidInput), Error: "invalid_input: /text: want a string"}
	if diff := cmp.Diff(want, newest(), ignore); diff != "" {
		t.Errorf("run call's record (-want +got):\n%s", diff)
	}

	// A denied call: the audit goes first, so it records the denial.
	denied := intercept.Tools{s.AuditTrail(nil), denyAll{}}
	denied.Call(ctx, keel.ToolInvocation{Name: "readfile", Args: json.RawMessage(`{}`)}, func(context.Context) intercept.ToolOutcome {
		t.Error("a denied call ran")
		return intercept.ToolOutcome{}
	})
	want = keel.ToolAudit{Tool: "readfile", ArgsSHA256: argsSum(`{}`), Outcome: string(keel.ToolPermissionDenied),
		Error: "permission_denied: the call of readfile was denied by policy: tools are off"}
	if diff := cmp.Diff(want, newest(), ignore); diff != "" {
		t.Errorf("denied call's record (-want +got):\n%s", diff)
	}
}

var _ intercept.Tool = (*store.AuditTrail)(nil)
