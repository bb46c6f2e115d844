package cli_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// watchWriter collects what a command writes and closes seen once it has
// written want.
type watchWriter struct {
	mu   sync.Mutex
	b    strings.Builder
	want string
	seen chan struct{}
}

func newWatchWriter(want string) *watchWriter {
	return &watchWriter{want: want, seen: make(chan struct{})}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.b.String(), w.want)
	w.b.Write(p)
	if !had && strings.Contains(w.b.String(), w.want) {
		close(w.seen)
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// result is how a command ended.
type result struct {
	code   int
	stdout *watchWriter
	stderr string
}

// keelAsync runs the command line with ctx in the background; its stdout
// closes seen once it printed want.
func (d *testDaemon) keelAsync(ctx context.Context, want string, args ...string) (*watchWriter, <-chan result) {
	out, errb := newWatchWriter(want), newWatchWriter("\x00")
	done := make(chan result, 1)
	go func() {
		code := cli.Main(ctx, append(args, "--data-dir", d.dir), out, errb)
		done <- result{code, out, errb.String()}
	}()
	return out, done
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
		panic("unreachable")
	}
}

// TestDetachAndAttach: Ctrl-C on `keel run` cancelled the run; it must
// detach (the run goes on, exit 130, saying how to attach and cancel);
// `keel run --detach` prints the run id and returns; `keel attach`
// follows a run live, from any seq, and exits with the run's code.
func TestDetachAndAttach(t *testing.T) {
	t.Parallel()
	release := map[string]chan struct{}{"first": make(chan struct{}), "second": make(chan struct{})}
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
			select {
			case <-release[goal]:
				return models.ChatResponse{Message: models.Message{Content: "finished " + goal}}, nil
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
		})}
	})
	d := startDaemon(t, daemon.Config{}, p, map[string]string{})
	bg := context.Background()

	// --detach: the id alone on stdout, the run going on.
	out, errs, code := d.keel(bg, "run", "--detach", "first")
	first := keel.RunID(strings.TrimSpace(out))
	if code != cli.ExitOK || !strings.HasPrefix(string(first), "run_") || !strings.Contains(errs, "keel attach "+string(first)) {
		t.Fatalf("keel run --detach: exit %d, stdout %q, stderr %q; want the run id and how to attach", code, out, errs)
	}

	// Ctrl-C on keel run detaches: the run is not cancelled.
	ctx, interrupt := context.WithCancel(bg)
	w, done := d.keelAsync(ctx, "run started", "run", "second")
	wait(t, w.seen, "keel run shows the run start")
	interrupt()
	r := wait(t, done, "keel run exits after Ctrl-C")
	second := keel.RunID(strings.Fields(r.stdout.String())[1])
	if r.code != cli.ExitDetached || !strings.Contains(r.stderr, "detached from run "+string(second)) ||
		!strings.Contains(r.stderr, fmt.Sprintf("keel attach %s --from ", second)) || !strings.Contains(r.stderr, "keel cancel "+string(second)) {
		t.Errorf("keel run after Ctrl-C: exit %d, stderr %q; want %d, saying how to attach again and how to cancel", r.code, r.stderr, cli.ExitDetached)
	}
	for _, id := range []keel.RunID{first, second} {
		if det, err := d.c.GetRun(bg, id); err != nil || det.Run.Status.Terminal() {
			t.Errorf("run %s after the CLI left: %v, %v; want it still going", id, det.Run.Status, err)
		}
	}

	// attach follows live: the journal so far, then the end.
	w, done = d.keelAsync(bg, "run started", "attach", string(first))
	wait(t, w.seen, "keel attach shows the journal")
	close(release["first"])
	r = wait(t, done, "keel attach exits when the run ends")
	if r.code != cli.ExitOK || !strings.Contains(r.stdout.String(), "run succeeded") || !strings.Contains(r.stdout.String(), "finished first") {
		t.Errorf("keel attach: exit %d\n%s%s\nwant 0 and the run's end", r.code, r.stdout, r.stderr)
	}
	// --from: only the events from that seq on, of an ended run too.
	det, err := d.c.GetRun(bg, first)
	if err != nil {
		t.Fatal(err)
	}
	last := det.Events[len(det.Events)-1]
	out, _, code = d.keel(bg, "attach", string(first), "--from", fmt.Sprint(last.Seq))
	if code != cli.ExitOK || strings.Contains(out, "run started") || !strings.Contains(out, fmt.Sprintf("%3d run succeeded", last.Seq)) {
		t.Errorf("keel attach --from %d: exit %d\n%s\nwant only the last event", last.Seq, code, out)
	}

	// Cancelling a run another keel attach follows ends that one with
	// the cancelled code.
	w, done = d.keelAsync(bg, "run started", "attach", string(second))
	wait(t, w.seen, "keel attach shows the journal")
	if _, _, code := d.keel(bg, "cancel", string(second)); code != cli.ExitOK {
		t.Fatalf("keel cancel: exit %d", code)
	}
	if r = wait(t, done, "keel attach exits when the run is cancelled"); r.code != cli.ExitCancelled || !strings.Contains(r.stdout.String(), "run cancelled") {
		t.Errorf("keel attach of a cancelled run: exit %d, want %d\n%s", r.code, cli.ExitCancelled, r.stdout)
	}
}
