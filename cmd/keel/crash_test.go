package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Shape of the crash harness: runs, tool calls per run, SIGKILLs.
const (
	crashRuns      = 12
	crashWaves     = 3 // runs are started in waves, after kills
	crashToolCalls = 3
	crashKills     = 8
)

// TestCrashHarness starts the real keel binary, runs many runs whose
// model (an OpenAI-compatible server in this test, answering by the
// run's goal) calls a non-idempotent tool that counts its own executions
// in a file, and kills the daemon with SIGKILL at random moments —
// while the model streams, while the tool sleeps, between journal writes
// — restarting it each time. At the end every run must have succeeded,
// every run's journal must be gapless with one model result per step and
// one tool result per call, and no tool call may have run twice. Runs
// left waiting (a kill during the tool call: its outcome is unknown) are
// decided as a human would, by looking at the tool's file.
func TestCrashHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a wasm tool")
	}
	t.Parallel()
	e := newCrashEnv(t)
	bin, dir, work, env, model := e.bin, e.dir, e.work, e.env, e.model

	d := startKeel(t, bin, env, dir)
	ctx := context.Background()
	c := dialWait(t, dir)
	e.grantTally(t, c)

	var ids []keel.RunID
	startWave := func(c *client.Client, wave int) {
		for i := range crashRuns / crashWaves {
			goal := fmt.Sprintf("job-%d-%d", wave, i)
			r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: goal, Model: "default", MaxSteps: crashToolCalls + 2})
			if err != nil {
				t.Fatalf("start %s: %v", goal, err)
			}
			ids = append(ids, r.ID)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	startWave(c, 0)
	for kill := range crashKills {
		time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
		c.Close()
		d.kill(t)
		d = startKeel(t, bin, env, dir)
		c = dialWait(t, dir)
		if w := kill/2 + 1; kill%2 == 1 && w < crashWaves {
			startWave(c, w)
		}
	}
	defer func() { c.Close(); d.stop(t) }()

	// Let every run end, deciding for those left waiting.
	changed := watchRuns(t, c, ids)
	decided := map[keel.RunID]int{}
	deadline := time.Now().Add(patience)
	for pending := len(ids); pending > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d runs did not end in %s", pending, patience)
		}
		awaitChange(changed)
		pending = 0
		for _, id := range ids {
			det, err := c.GetRun(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			switch det.Run.Status {
			case keel.RunSucceeded, keel.RunFailed, keel.RunCancelled:
				continue
			case keel.RunWaiting:
				if last := det.Events[len(det.Events)-1]; last.Type == keel.EventHumanDecision {
					// Decided; the run goes on in a moment (or, if the
					// daemon was killed in between, when it restarts).
					pending++
					continue
				}
				call := waitingCall(t, det)
				decision := keel.DecisionRetry
				if tally(t, work)[callKey(t, call)] > 0 {
					decision = keel.DecisionDone // it ran before the kill: the file says so
				}
				if _, err := c.Decide(ctx, protocol.RunDecideParams{RunID: id, CallID: call.ID, Decision: decision}); err != nil {
					t.Fatalf("decide %s: %v", id, err)
				}
				decided[id]++
			}
			pending++
		}
	}

	counts := tally(t, work)
	for _, id := range ids {
		det, err := c.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if det.Run.Status != keel.RunSucceeded {
			t.Errorf("%s (%s) ended %s: %s", id, det.Run.Goal, det.Run.Status, det.Run.Error)
		}
		checkCrashJournal(t, det)
		// A span the kills left open was closed on restart, in ended
		// runs too (issue 13, item 12).
		for _, sp := range det.Spans {
			if sp.Status == keel.SpanRunning {
				t.Errorf("%s ended %s with span %s (%s %s, step %d) still running", id, det.Run.Status, sp.ID, sp.Kind, sp.Name, sp.Step)
			}
		}
		for k := 1; k <= crashToolCalls; k++ {
			key := fmt.Sprintf("%s#%d", det.Run.Goal, k)
			if counts[key] != 1 {
				t.Errorf("%s: tool call %s ran %d times, want exactly once", id, key, counts[key])
			}
		}
	}
	n := 0
	for _, v := range decided {
		n += v
	}
	t.Logf("%d runs, %d kills, %d human decisions, %d model requests", len(ids), crashKills, n, model.requests())
}

// Shape of the approval crash test.
const (
	approvalRuns     = 6
	approvalMaxKills = 12 // SIGKILLs in all, at most
)

// TestCrashWhileWaitingForApproval starts the real daemon with
// --require-approval non_idempotent_write, so that every call of tally
// waits for a person, and kills it with SIGKILL while runs wait, right
// after answers (also while the restarted daemon still compiles tally,
// so that the kill lands between the answer and going on for sure), as
// soon as an approved call starts, and while a call a person said to
// retry runs again. A waiting run stays waiting across a restart, its
// journal untouched, showing the same call and hash to approve; an
// answer binds to its run, call and hash; an answer journaled just
// before a kill is acted on after the restart, and never twice; a call
// whose outcome a kill made unknown runs again only when a person says
// so, each time. At the end every run succeeded, every approved call ran
// exactly once, no denied call ran, and every request has exactly one
// decision and one finished human.wait span. The seed of the answers and
// kills is logged; KEEL_CRASH_DUMP=1 logs every journal.
func TestCrashWhileWaitingForApproval(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a wasm tool")
	}
	t.Parallel()
	began := time.Now()
	e := newCrashEnv(t)
	flags := []string{"--require-approval", string(keel.SideEffectNonIdempotentWrite)}
	d := startKeel(t, e.bin, e.env, e.dir, flags...)
	c := dialWait(t, e.dir)
	defer func() {
		if c != nil {
			c.Close()
		}
		if d != nil {
			d.stop(t)
		}
	}()
	var kills []time.Time // when each SIGKILL was sent
	ids := make([]keel.RunID, approvalRuns)
	var changed <-chan struct{} // an event of one of the runs ids on c
	// restart kills the daemon and starts it again; cold drops the
	// compiled tools first, so that it compiles tally again for seconds,
	// during which no run can go on.
	restart := func(cold bool) {
		kills = append(kills, time.Now())
		d.kill(t)
		c.Close()
		d, c = nil, nil
		if cold {
			if err := os.RemoveAll(filepath.Join(e.dir, "cache")); err != nil {
				t.Fatal(err)
			}
		}
		d = startKeel(t, e.bin, e.env, e.dir, flags...)
		c = dialWait(t, e.dir)
		changed = watchRuns(t, c, ids)
	}
	e.grantTally(t, c)
	ctx := context.Background()
	for i := range ids {
		goal := fmt.Sprintf("approve-%d", i)
		r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: goal, Model: "default", MaxSteps: crashToolCalls + 2})
		if err != nil {
			t.Fatalf("start %s: %v", goal, err)
		}
		ids[i] = r.ID
	}
	dump := func() {
		t.Logf("kills at %v", kills)
		for _, id := range ids {
			for _, ev := range getRun(t, c, id).Events {
				t.Logf("%s %3d %s %-19s %s", id, ev.Seq, ev.Time.Format("15:04:05.000000"), ev.Type, ev.Data)
			}
		}
	}

	// Every run waits for the approval of its first call; a kill and a
	// restart change nothing: not the status, not one event, not a span.
	changed = watchRuns(t, c, ids)
	before := map[keel.RunID]protocol.RunDetail{}
	for deadline := time.Now().Add(patience); len(before) < len(ids); awaitChange(changed) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d runs asked for an approval in %s", len(before), len(ids), patience)
		}
		for _, id := range ids {
			det := getRun(t, c, id)
			if det.Run.Status.Terminal() {
				t.Fatalf("%s ended %s before any approval: %s", id, det.Run.Status, det.Run.Error)
			}
			if det.Run.Status == keel.RunWaiting && det.Events[len(det.Events)-1].Type == keel.EventApprovalAsked {
				before[id] = det
			}
		}
	}
	restart(false)
	waitToolsReady(t, c)
	time.Sleep(300 * time.Millisecond) // Resume runs once tools are ready: let it act, if it would
	for _, id := range ids {
		det, was := getRun(t, c, id), before[id]
		if det.Run.Status != keel.RunWaiting {
			t.Errorf("%s is %s after the restart, want %s", id, det.Run.Status, keel.RunWaiting)
		}
		if diff := cmp.Diff(was.Events, det.Events); diff != "" {
			t.Errorf("%s: the journal changed across the restart (-before +after):\n%s", id, diff)
		}
		if diff := cmp.Diff(was.Spans, det.Spans); diff != "" {
			t.Errorf("%s: the spans changed across the restart (-before +after):\n%s", id, diff)
		}
		req, wasReq := lastRequest(t, det), lastRequest(t, was)
		if req.Call.ID != wasReq.Call.ID || string(req.Call.Arguments) != string(wasReq.Call.Arguments) || req.ArgsSHA256 != wasReq.ArgsSHA256 {
			t.Errorf("%s asks for %s %s (%s) after the restart, want %s %s (%s)", id, req.Call.ID, req.Call.Arguments, req.ArgsSHA256,
				wasReq.Call.ID, wasReq.Call.Arguments, wasReq.ArgsSHA256)
		}
		if sum := sha256.Sum256(req.Call.Arguments); req.ArgsSHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: approval.requested shows hash %s for arguments %s, want their sha256", id, req.ArgsSHA256, req.Call.Arguments)
		}
		if sp, ok := spanByID(det.Spans, req.SpanID); !ok || sp.Kind != keel.SpanHuman || sp.Status != keel.SpanRunning {
			t.Errorf("%s: span %s of the waiting approval = %+v (found %v), want a running %s span", id, req.SpanID, sp, ok, keel.SpanHuman)
		}
	}
	if n := tally(t, e.work); len(n) != 0 {
		t.Errorf("tally ran %v while every call waited for its approval", n)
	}
	if t.Failed() {
		t.FailNow()
	}

	// An answer binds to its run, its call and the hash it was shown.
	a, b := lastRequest(t, before[ids[0]]), lastRequest(t, before[ids[1]])
	if a.ArgsSHA256 == b.ArgsSHA256 || a.Call.ID == b.Call.ID {
		t.Fatalf("runs %s and %s wait on the same call or hash: %+v, %+v", ids[0], ids[1], a, b)
	}
	wrong := strings.Repeat("0", 64)
	for _, tc := range []struct {
		name string
		p    protocol.RunApproveParams
		code int
	}{
		{"approval with a wrong hash", protocol.RunApproveParams{RunID: ids[0], CallID: a.Call.ID, ArgsSHA256: wrong, Approved: true}, protocol.CodeConflict},
		{"denial with a wrong hash", protocol.RunApproveParams{RunID: ids[0], CallID: a.Call.ID, ArgsSHA256: wrong, Reason: "no"}, protocol.CodeConflict},
		{"approval without a hash", protocol.RunApproveParams{RunID: ids[0], CallID: a.Call.ID, Approved: true}, protocol.CodeInvalidParams},
		{"run A's call and hash on run B", protocol.RunApproveParams{RunID: ids[1], CallID: a.Call.ID, ArgsSHA256: a.ArgsSHA256, Approved: true}, protocol.CodeConflict},
		{"run A's hash for run B's call", protocol.RunApproveParams{RunID: ids[1], CallID: b.Call.ID, ArgsSHA256: a.ArgsSHA256, Approved: true}, protocol.CodeConflict},
	} {
		var pe *protocol.Error
		if _, err := c.ApproveRun(ctx, tc.p); !errors.As(err, &pe) || pe.Code != tc.code {
			t.Errorf("ApproveRun(%s) = %v, want a refusal with code %d", tc.name, err, tc.code)
		}
	}
	for _, id := range ids[:2] {
		if diff := cmp.Diff(before[id].Events, getRun(t, c, id).Events); diff != "" {
			t.Errorf("%s: refused answers changed the journal (-before +after):\n%s", id, diff)
		}
	}
	if n := tally(t, e.work); len(n) != 0 {
		t.Errorf("tally ran %v after refused answers", n)
	}

	// answer answers the approval run ids[i] waits for: its first call
	// approved for half the runs and denied for the other half, later
	// calls at random. It returns what it sent.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	approved := map[string]bool{} // the answer given, by call key
	answer := func(i int, det protocol.RunDetail) protocol.RunApproveParams {
		t.Helper()
		req := lastRequest(t, det)
		key := callKey(t, req.Call)
		if _, dup := approved[key]; dup {
			t.Fatalf("%s asks again to approve %s (%s), which was answered", det.Run.ID, req.Call.ID, key)
		}
		yes := rng.IntN(2) == 0
		if strings.HasSuffix(key, "#1") {
			yes = i%2 == 0
		}
		p := protocol.RunApproveParams{RunID: det.Run.ID, CallID: req.Call.ID, ArgsSHA256: req.ArgsSHA256, Approved: yes}
		if !yes {
			p.Reason = "not " + key
		}
		if _, err := c.ApproveRun(ctx, p); err != nil {
			t.Fatalf("answer %s (approved %v): %v", key, yes, err)
		}
		approved[key] = yes
		return p
	}
	// sentAgain sends p again, as a client would after losing its
	// connection: it must be refused, the journal has it.
	sentAgain := func(p protocol.RunApproveParams) {
		t.Helper()
		if _, err := c.ApproveRun(ctx, p); !isConflict(err) {
			t.Errorf("answer %+v sent again after the restart = %v, want a refusal with code %d", p, err, protocol.CodeConflict)
		}
	}

	// An answer given while the restarted daemon compiles its tools is
	// journaled, but its run cannot go on until they are ready: a kill
	// then lands for sure between the answer and going on. After the
	// next restart the run goes on from the journaled answer, also when
	// the runs created before it were answered in the meantime (they
	// too wait for the tools, and Resume then finds them answered).
	x := len(ids) - 1
	restart(true)
	px := answer(x, getRun(t, c, ids[x]))
	if det := getRun(t, c, ids[x]); det.Run.Status != keel.RunWaiting || det.Events[len(det.Events)-1].Type != keel.EventApproval {
		t.Logf("%s went on before its tool compiled (%s, last event %s): the kill may not land between the answer and going on",
			ids[x], det.Run.Status, det.Events[len(det.Events)-1].Type)
	}
	restart(true)
	sentAgain(px)
	var sent []protocol.RunApproveParams
	for i := range ids[:x] {
		sent = append(sent, answer(i, getRun(t, c, ids[i])))
	}
	if res, err := c.ToolsList(ctx); err != nil || res.Compiling == nil {
		t.Logf("tally compiled before the answers were all given (%v): Resume may not meet them", err)
	}
	waitToolsReady(t, c)
	var stuck []keel.RunID
	for deadline := time.Now().Add(patience); ; awaitChange(changed) {
		stuck = stuck[:0]
		for _, id := range ids {
			if det := getRun(t, c, id); det.Run.Status == keel.RunWaiting && det.Events[len(det.Events)-1].Type == keel.EventApproval {
				stuck = append(stuck, id)
			}
		}
		if len(stuck) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(stuck) > 0 {
		var resume []string
		for _, line := range strings.Split(d.logs.String(), "\n") {
			if strings.Contains(line, "resume") {
				resume = append(resume, line)
			}
		}
		t.Errorf("%v still wait %s after the daemon could run them, with their answers journaled (%s answered before the kill, the others after the restart, all before tally compiled); daemon log: %q",
			stuck, patience, ids[x], resume)
		restart(false) // lets them go on, and the rest of the test
	}
	for _, p := range sent {
		sentAgain(p)
	}

	// Answer every request as it comes; sometimes kill the daemon as
	// soon as the answer is journaled, or as soon as the approved call
	// starts; decide about calls a kill left unknown as a person would.
	decisions, retries := 0, 0
	deadline := time.Now().Add(patience)
	for {
		pending := 0
		for i, id := range ids {
			det := getRun(t, c, id)
			if det.Run.Status.Terminal() {
				continue
			}
			pending++
			if det.Run.Status != keel.RunWaiting {
				continue
			}
			switch last := det.Events[len(det.Events)-1]; last.Type {
			case keel.EventApprovalAsked:
				p, seq := answer(i, det), last.Seq
				killed := false
				if p.Approved && retries == 0 && len(kills) < approvalMaxKills && rng.IntN(2) == 0 && callStarted(t, c, changed, id, p.CallID, seq) {
					// Killed as soon as the call's intent is journaled:
					// tally may not have written yet, and then a person
					// says retry (below).
					restart(false)
					killed = true
				}
				if n := len(approved); !killed && len(kills) < approvalMaxKills && (n == 8 || n == 11 || n == 14 || rng.IntN(4) == 0) {
					restart(false) // the answer is journaled; the run may not have gone on
					sentAgain(p)
				}
			case keel.EventRunWaiting:
				// Killed while tally ran: decide as a person would, by
				// looking at the tool's file.
				call := waitingCall(t, det)
				decision := keel.DecisionRetry
				if tally(t, e.work)[callKey(t, call)] > 0 {
					decision = keel.DecisionDone
				}
				if _, err := c.Decide(ctx, protocol.RunDecideParams{RunID: id, CallID: call.ID, Decision: decision}); err != nil {
					if isConflict(err) {
						// A restarted daemon resumes a waiting run, which
						// runs until it asks again; nothing was recorded,
						// so look again, as a person would.
						continue
					}
					t.Fatalf("decide %s: %v", id, err)
				}
				decisions++
				if decision == keel.DecisionRetry && retries < 2 && callStarted(t, c, changed, id, call.ID, last.Seq) {
					// Killed while the retried call runs: its outcome is
					// unknown again, so the run must ask again, not run
					// it once more on its own.
					restart(false)
					retries++
				}
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			dump()
			t.Fatalf("%d runs did not end in %s", pending, patience)
		}
		awaitChange(changed)
	}
	if len(kills) < 6 { // one while every run waited, two around compiling, three after answers
		t.Errorf("%d kills, want at least 6", len(kills))
	}

	counts := tally(t, e.work)
	late := 0
	for _, id := range ids {
		det := getRun(t, c, id)
		if det.Run.Status != keel.RunSucceeded {
			t.Errorf("%s (%s) ended %s: %s", id, det.Run.Goal, det.Run.Status, det.Run.Error)
		}
		checkCrashJournal(t, det, keel.ToolDenied)
		late += checkApprovals(t, det, approved, kills)
		for k := 1; k <= crashToolCalls; k++ {
			key := fmt.Sprintf("%s#%d", det.Run.Goal, k)
			yes, ok := approved[key]
			want := 0
			if yes {
				want = 1
			}
			if !ok {
				t.Errorf("%s: call %s was never put to a person", id, key)
			}
			if counts[key] != want {
				t.Errorf("%s: call %s (approved %v) ran %d times, want %d", id, key, yes, counts[key], want)
			}
		}
	}
	for key, n := range counts {
		if _, ok := approved[key]; !ok {
			t.Errorf("tally ran %s %d times, but nobody was asked", key, n)
		}
	}
	if t.Failed() || os.Getenv("KEEL_CRASH_DUMP") != "" {
		dump()
	}
	t.Logf("%d runs, %d answers, %d kills, %d answers acted on only after a restart, %d decisions after a kill mid-call, %d retried calls killed again, %d model requests, %s",
		len(ids), len(approved), len(kills), late, decisions, retries, e.model.requests(), time.Since(began).Round(time.Second))
}

// checkApprovals checks a run's approvals: every call was put to a
// person once, answered once with the hash it showed and the answer the
// test gave (approved, by call key); no call ran before its approval or
// at all when denied, a call started again only after a person said
// retry, and a denial reached the model with its reason. Every request
// has its human.wait span, finished with the answer's
// status. It returns how many answers the run acted on only after a
// restart (the next event after the answer is run.resumed, after a kill
// that came after the answer).
func checkApprovals(t *testing.T, det protocol.RunDetail, approved map[string]bool, kills []time.Time) (late int) {
	t.Helper()
	id := det.Run.ID
	asked := map[string]keel.ApprovalRequestData{} // by call ID
	answers := map[string]keel.ApprovalData{}
	answered := map[string]int{}
	started := map[string]bool{} // the call's intent is journaled
	retry := map[string]bool{}   // a person said retry since
	for i, ev := range det.Events {
		switch ev.Type {
		case keel.EventApprovalAsked:
			var r keel.ApprovalRequestData
			json.Unmarshal(ev.Data, &r)
			if _, dup := asked[r.Call.ID]; dup {
				t.Errorf("%s: approval of %s asked twice (seq %d)", id, r.Call.ID, ev.Seq)
			}
			asked[r.Call.ID] = r
		case keel.EventApproval:
			var a keel.ApprovalData
			json.Unmarshal(ev.Data, &a)
			r, ok := asked[a.CallID]
			if !ok {
				t.Errorf("%s: answer for %s (seq %d) without a request before it", id, a.CallID, ev.Seq)
				continue
			}
			answered[a.CallID]++
			answers[a.CallID] = a
			if want := approved[callKey(t, r.Call)]; a.Approved != want || a.ArgsSHA256 != r.ArgsSHA256 {
				t.Errorf("%s: answer %+v for %s, want approved %v with hash %s", id, a, a.CallID, want, r.ArgsSHA256)
			}
			if i+1 < len(det.Events) {
				if next := det.Events[i+1]; next.Type == keel.EventRunResumed && slices.ContainsFunc(kills, func(k time.Time) bool {
					return k.After(ev.Time) && k.Before(next.Time)
				}) {
					late++
				}
			}
		case keel.EventToolCall:
			var d keel.ToolCallData
			json.Unmarshal(ev.Data, &d)
			if a, ok := answers[d.Call.ID]; !ok || !a.Approved {
				t.Errorf("%s: %s ran (seq %d) without an approval", id, d.Call.ID, ev.Seq)
			}
			if started[d.Call.ID] && !retry[d.Call.ID] {
				t.Errorf("%s: %s started again (seq %d) with no person's retry since it last started", id, d.Call.ID, ev.Seq)
			}
			started[d.Call.ID], retry[d.Call.ID] = true, false
		case keel.EventHumanDecision:
			var d keel.HumanDecisionData
			json.Unmarshal(ev.Data, &d)
			retry[d.CallID] = d.Decision == keel.DecisionRetry
		case keel.EventToolResult:
			var d keel.ToolResultData
			json.Unmarshal(ev.Data, &d)
			a := answers[d.CallID]
			switch denied := d.Error != nil && d.Error.Code == keel.ToolDenied; {
			case denied && (a.Approved || !strings.Contains(d.Error.Message, a.Reason) || a.Reason == ""):
				t.Errorf("%s: %s denied with %q; the answer was %+v", id, d.CallID, d.Error.Message, a)
			case !denied && !a.Approved:
				t.Errorf("%s: %s denied, but its result is %s %+v", id, d.CallID, d.Output, d.Error)
			}
		}
	}
	if len(asked) != crashToolCalls {
		t.Errorf("%s: %d approvals asked, want %d", id, len(asked), crashToolCalls)
	}
	human := 0
	for _, sp := range det.Spans {
		if sp.Kind == keel.SpanHuman {
			human++
		}
	}
	if human != len(asked) {
		t.Errorf("%s: %d %s spans for %d approval requests", id, human, keel.SpanHuman, len(asked))
	}
	for call, r := range asked {
		if answered[call] != 1 {
			t.Errorf("%s: call %s answered %d times, want once", id, call, answered[call])
		}
		want := keel.SpanOK
		if !answers[call].Approved {
			want = keel.SpanError
		}
		if sp, ok := spanByID(det.Spans, r.SpanID); !ok || sp.Kind != keel.SpanHuman || sp.Status != want {
			t.Errorf("%s: span %s of the approval of %s = %+v (found %v), want a %s span with status %s", id, r.SpanID, call, sp, ok, keel.SpanHuman, want)
		}
	}
	return late
}

// callStarted waits until run id journals the intent of call (tool.call)
// after seq, and reports whether it did before the call's result or the
// run's end. It looks at the run's journal at each event of the runs
// changed follows.
func callStarted(t *testing.T, c *client.Client, changed <-chan struct{}, id keel.RunID, call string, seq int64) bool {
	t.Helper()
	expired := time.After(patience)
	for {
		det := getRun(t, c, id)
		for _, ev := range det.Events[min(int(seq), len(det.Events)):] {
			switch ev.Type {
			case keel.EventToolCall:
				var d keel.ToolCallData
				if json.Unmarshal(ev.Data, &d) == nil && d.Call.ID == call {
					return true
				}
			case keel.EventToolResult:
				var d keel.ToolResultData
				if json.Unmarshal(ev.Data, &d) == nil && d.CallID == call {
					return false
				}
			}
		}
		if det.Run.Status.Terminal() {
			return false
		}
		select {
		case <-changed:
		case <-expired:
			return false
		}
	}
}

// watchRuns subscribes c to the events of runs ids. The channel it
// returns receives whenever one of them journals an event (one signal
// pending at most: several events may arrive as one); it stops when c
// closes.
func watchRuns(t *testing.T, c *client.Client, ids []keel.RunID) <-chan struct{} {
	t.Helper()
	changed := make(chan struct{}, 1)
	go func() {
		for range c.Events() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}()
	for _, id := range ids {
		if _, err := c.Subscribe(context.Background(), id, 0); err != nil {
			t.Fatalf("subscribe to %s: %v", id, err)
		}
	}
	return changed
}

// awaitChange waits for a signal of changed, at most a second: a loop
// that acts on what the runs show then looks again, and misses nothing
// even when no event comes (a restarted daemon resumes them only once its
// tools are ready).
func awaitChange(changed <-chan struct{}) {
	select {
	case <-changed:
	case <-time.After(time.Second):
	}
}

func getRun(t *testing.T, c *client.Client, id keel.RunID) protocol.RunDetail {
	t.Helper()
	det, err := c.GetRun(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return det
}

// lastRequest is the approval a waiting run asks for: its last event.
func lastRequest(t *testing.T, det protocol.RunDetail) keel.ApprovalRequestData {
	t.Helper()
	last := det.Events[len(det.Events)-1]
	var r keel.ApprovalRequestData
	if last.Type != keel.EventApprovalAsked || json.Unmarshal(last.Data, &r) != nil || r.Call.ID == "" {
		t.Fatalf("%s: last event is %s %s, want %s", det.Run.ID, last.Type, last.Data, keel.EventApprovalAsked)
	}
	return r
}

func spanByID(spans []keel.Span, id string) (keel.Span, bool) {
	for _, sp := range spans {
		if sp.ID == id {
			return sp, true
		}
	}
	return keel.Span{}, false
}

func isConflict(err error) bool {
	var pe *protocol.Error
	return errors.As(err, &pe) && pe.Code == protocol.CodeConflict
}

// waitToolsReady waits until the daemon has compiled the tools it found
// at start (it resumes runs then).
func waitToolsReady(t *testing.T, c *client.Client) {
	t.Helper()
	if err := toolsReady(c, patience); err != nil {
		t.Fatal(err)
	}
}

// checkCrashJournal checks one run's journal: sequence numbers 1..n
// without gaps or repeats, one model result per step, one tool result per
// call, no tool error but those of the codes allowed, and exactly one
// ending, last.
func checkCrashJournal(t *testing.T, det protocol.RunDetail, allowed ...keel.ToolErrorCode) {
	t.Helper()
	steps := map[int]int{}
	results := map[string]int{}
	ends := 0
	for i, ev := range det.Events {
		if ev.Seq != int64(i+1) {
			t.Errorf("%s: event %d has seq %d", det.Run.ID, i+1, ev.Seq)
		}
		switch ev.Type {
		case keel.EventModelResult:
			var d keel.ModelResultData
			json.Unmarshal(ev.Data, &d)
			steps[d.Step]++
		case keel.EventToolResult:
			var d keel.ToolResultData
			json.Unmarshal(ev.Data, &d)
			results[d.CallID]++
			if d.Error != nil && !slices.Contains(allowed, d.Error.Code) {
				t.Errorf("%s: tool call %s failed: %s", det.Run.ID, d.CallID, d.Error.Message)
			}
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			ends++
			if i != len(det.Events)-1 {
				t.Errorf("%s: %s is not the last event", det.Run.ID, ev.Type)
			}
		}
	}
	for step, n := range steps {
		if n != 1 {
			t.Errorf("%s: model step %d journaled %d times", det.Run.ID, step, n)
		}
	}
	for call, n := range results {
		if n != 1 {
			t.Errorf("%s: call %s has %d results", det.Run.ID, call, n)
		}
	}
	if ends != 1 {
		t.Errorf("%s: %d endings", det.Run.ID, ends)
	}
}

func waitingCall(t *testing.T, det protocol.RunDetail) keel.ToolCall {
	t.Helper()
	last := det.Events[len(det.Events)-1]
	var d keel.RunWaitingData
	if last.Type != keel.EventRunWaiting || json.Unmarshal(last.Data, &d) != nil || d.Call == nil {
		t.Fatalf("%s is waiting but its last event is %s %s", det.Run.ID, last.Type, last.Data)
	}
	return *d.Call
}

func callKey(t *testing.T, call keel.ToolCall) string {
	t.Helper()
	var in struct{ Key string }
	if err := json.Unmarshal(call.Arguments, &in); err != nil || in.Key == "" {
		t.Fatalf("call %s arguments %s", call.ID, call.Arguments)
	}
	return in.Key
}

// tally counts each key in the tool's own log of its executions.
func tally(t *testing.T, work string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(work, "tally.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" {
			counts[line]++
		}
	}
	return counts
}

// scriptModel is an OpenAI-compatible chat server that drives each run by
// its goal: while the conversation has fewer than crashToolCalls tool
// results it streams a call of tally with the key GOAL#k, then an answer.
// It pauses before and while streaming, so kills land mid-stream.
type scriptModel struct {
	*httptest.Server
	mu sync.Mutex
	n  int
	// hangGone receives once for each "hang" request whose caller went
	// away.
	hangGone chan struct{}
}

func newScriptModel(t *testing.T) *scriptModel {
	m := &scriptModel{hangGone: make(chan struct{}, 16)}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

func (m *scriptModel) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

func (m *scriptModel) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	m.mu.Lock()
	m.n++
	m.mu.Unlock()
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	goal, results := "", 0
	for _, msg := range req.Messages {
		switch msg.Role {
		case "user":
			if s, ok := msg.Content.(string); ok && goal == "" {
				goal = s
			}
		case "tool":
			results++
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	send := func(delta map[string]any, finish any) {
		chunk := map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		b, _ := json.Marshal(chunk)
		fmt.Fprintf(w, "data: %s\n\n", b)
		flusher.Flush()
	}
	pause := func() { time.Sleep(time.Duration(rand.IntN(60)) * time.Millisecond) }
	pause()
	if strings.HasPrefix(goal, "hang") {
		// Starts answering, then never finishes: until the caller goes.
		send(map[string]any{"role": "assistant", "content": "Thinking"}, nil)
		<-r.Context().Done()
		select {
		case m.hangGone <- struct{}{}:
		default:
		}
		return
	}
	if results < crashToolCalls {
		k := results + 1
		args, _ := json.Marshal(map[string]any{"key": fmt.Sprintf("%s#%d", goal, k), "sleep_ms": 50 + rand.IntN(300)})
		send(map[string]any{"role": "assistant", "content": "Recording step."}, nil)
		pause()
		send(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": fmt.Sprintf("call_%s_%d", goal, k), "type": "function",
			"function": map[string]any{"name": "tally", "arguments": string(args)}}}}, nil)
		send(map[string]any{}, "tool_calls")
	} else {
		for _, word := range []string{"All ", "steps ", "of ", goal, " recorded."} {
			send(map[string]any{"role": "assistant", "content": word}, nil)
			pause()
		}
		send(map[string]any{}, "stop")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
}

// crashEnv is what the crash tests share: a data directory holding the
// tally tool (and not the bundled examples) and a models.json whose one route is the script model, the
// tool's workspace, and the daemon's environment (with no Ollama
// reachable). Its daemons load the tools from the shared cache.
type crashEnv struct {
	bin, dir, work string
	env            []string
	model          *scriptModel
}

func newCrashEnv(t *testing.T) crashEnv {
	t.Helper()
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	// Only tally: the bundled examples play no part here, and loading
	// them at each of the restarts would cost seconds.
	dir, env := testDataDir(t, tmp, shared.tally)
	model := newScriptModel(t)
	writeJSON(t, filepath.Join(dir, "models.json"), map[string]any{
		"providers": map[string]any{"fake": map[string]any{
			"base_url": model.URL + "/v1", "local": true, "max_retries": 5, "first_token_timeout": "10s",
			"models": []any{map[string]any{"name": "fake", "context_length": 32768, "capabilities": []string{"completion", "tools"}}},
		}},
		"routes": []any{map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "fake", "model": "fake"}}}},
	})
	return crashEnv{bin: shared.bin, dir: dir, work: work, env: env, model: model}
}

// grantTally grants tally the workspace. The daemon answers once it has
// compiled its tools.
func (e crashEnv) grantTally(t *testing.T, c *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := c.GrantTool(ctx, protocol.ToolsGrantParams{Name: "tally",
		Grants: capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: e.work, GuestPath: "/workspace"}}}})
	if err != nil {
		t.Fatalf("grant tally: %v", err)
	}
}

// buildKeel returns the keel binary TestMain built; tmp is unused.
func buildKeel(t *testing.T, tmp string) string {
	t.Helper()
	return shared.bin
}

func dialWait(t *testing.T, dir string) *client.Client {
	t.Helper()
	c, err := client.DialDataDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
