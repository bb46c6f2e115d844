package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

// TestAuditTrailSyncs: a direct call's record is committed without an
// fsync of its own (synchronous=NORMAL for its transaction) only when
// the tool declares itself read-only and the call reached no host; the
// writer's next transaction is synced again; every record is readable
// once the call returns.
func TestAuditTrailSyncs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	audit := intercept.Tools{s.AuditTrail(nil)}
	for i, tc := range []struct {
		name     string
		class    keel.SideEffect
		hosts    []string
		denied   bool
		unsynced bool
	}{
		{name: "read-only", class: keel.SideEffectReadOnly, unsynced: true},
		{name: "read-only, reached a host", class: keel.SideEffectReadOnly, hosts: []string{"example.com:443"}},
		{name: "idempotent write", class: keel.SideEffectIdempotentWrite},
		{name: "non-idempotent write", class: keel.SideEffectNonIdempotentWrite},
		{name: "external", class: keel.SideEffectExternal},
		{name: "no class declared"},
		{name: "read-only, denied", class: keel.SideEffectReadOnly, denied: true},
		{name: "read-only again", class: keel.SideEffectReadOnly, unsynced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chain := audit
			if tc.denied {
				chain = intercept.Tools{s.AuditTrail(nil), denyAll{}}
			}
			before := s.UnsyncedCommits()
			args := fmt.Sprintf(`{"case":%d}`, i)
			chain.Call(ctx, keel.ToolInvocation{Name: "t", Args: json.RawMessage(args), Touched: &keel.Touched{Hosts: tc.hosts}}, func(context.Context) intercept.ToolOutcome {
				return intercept.ToolOutcome{Build: intercept.ToolBuild{SideEffects: tc.class}, Output: json.RawMessage(`{}`)}
			})
			if got := s.UnsyncedCommits() - before; got != map[bool]int64{true: 1}[tc.unsynced] {
				t.Errorf("unsynced commits = %d, want %d", got, map[bool]int64{true: 1}[tc.unsynced])
			}
			recs, err := s.ToolCalls(ctx, "t", 1)
			sum := sha256.Sum256([]byte(args))
			if err != nil || len(recs) != 1 || recs[0].ArgsSHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("newest record = %+v, %v; want this call's", recs, err)
			}
		})
	}
	// After an unsynced commit, the writer's next transaction is synced
	// again, and an unsynced one is not.
	for _, unsynced := range []bool{true, false, true, true, false} {
		want := map[bool]int{false: 2, true: 1}[unsynced]
		if got, err := s.WriteSynchronous(ctx, unsynced); err != nil || got != want {
			t.Errorf("a write (unsynced %t) ran under synchronous %d, %v; want %d", unsynced, got, err, want)
		}
	}
}
