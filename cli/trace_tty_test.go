//go:build linux

package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// openPTY opens a pseudo-terminal: what is written to tty (a terminal,
// for the CLI) is read from pty.
func openPTY(t *testing.T) (pty, tty *os.File) {
	t.Helper()
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, pty.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		pty.Close()
		t.Skipf("unlock the pseudo-terminal: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, pty.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		pty.Close()
		t.Skipf("pseudo-terminal number: %v", e)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		pty.Close()
		t.Skipf("open the pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { pty.Close(); tty.Close() })
	return pty, tty
}

// TestTraceFollowTerminal: on a terminal, keel trace --follow draws the
// waterfall at once (the run waiting, its open spans running), redraws
// it in place on the run's events, and ends with the final one; Ctrl-C
// on a --follow into a pipe stops following and leaves the run going.
func TestTraceFollowTerminal(t *testing.T) {
	t.Parallel()
	// The model's last answer waits until the terminal shows a redraw
	// with the tool call: a drawing between the first and the last.
	release := make(chan struct{})
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{
			scripted.CallTools(keel.ToolCall{ID: "c1", Name: "tally", Arguments: json.RawMessage(`{"text":"a b"}`)}),
			scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
				select {
				case <-release:
					return models.ChatResponse{Message: models.Message{Content: "two words"}}, nil
				case <-ctx.Done():
					return models.ChatResponse{}, ctx.Err()
				}
			}),
		}
	})
	d := startDaemon(t, daemon.Config{RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly}}, p,
		map[string]string{
			filepath.Join("tools", "tally.wasm"):          string(wasmtest.CannedReactor(`{"output":{"words":2}}`)),
			filepath.Join("tools", "tally.manifest.json"): tallyManifest,
		})
	bg := context.Background()
	out, errs, code := d.keel(bg, "run", "--detach", "count words")
	if code != cli.ExitOK {
		t.Fatalf("keel run --detach: exit %d, stderr %q", code, errs)
	}
	id := keel.RunID(strings.TrimSpace(out))
	if _, err := d.c.Subscribe(bg, id, 0); err != nil {
		t.Fatal(err)
	}
	for ev := range d.c.Events() {
		if ev.RunID == id && ev.Type == keel.EventApprovalAsked {
			break
		}
	}

	// Ctrl-C, in a pipe.
	ctx, interrupt := context.WithCancel(bg)
	_, stopped := d.keelAsyncErr(ctx, "following run "+string(id), "trace", "--follow", string(id))
	wait(t, stopped.seen, "keel trace --follow says it follows")
	interrupt()
	if r := wait(t, stopped.done, "keel trace --follow exits on Ctrl-C"); r.code != cli.ExitDetached || !strings.Contains(r.stderr, "stopped following run "+string(id)) {
		t.Errorf("keel trace --follow after Ctrl-C: exit %d, stderr %q; want %d, saying it stopped following", r.code, r.stderr, cli.ExitDetached)
	}

	// On a terminal.
	pty, tty := openPTY(t)
	screen, tool, ended := newWatchWriter("(agent, waiting)"), newWatchWriter("tool.call tally"), newWatchWriter("(agent, succeeded)")
	drained := make(chan struct{}) // closed once the reader met the end of the terminal's output
	go func() {
		defer close(drained)
		buf := make([]byte, 4096)
		for {
			n, err := pty.Read(buf)
			screen.Write(buf[:n])
			tool.Write(buf[:n])
			ended.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	done := make(chan int, 1)
	go func() {
		done <- cli.Main(bg, []string{"trace", "--follow", "--width", "100", string(id), "--data-dir", d.dir}, tty, newWatchWriter("\x00"))
	}()
	wait(t, screen.seen, "keel trace --follow draws the waiting run")
	if _, errs, code := d.keel(bg, "approve", string(id), "c1"); code != cli.ExitOK {
		t.Fatalf("keel approve: exit %d, stderr %q", code, errs)
	}
	wait(t, tool.seen, "keel trace --follow redraws with the tool call")
	close(release)
	if code := wait(t, done, "keel trace --follow exits when the run ends"); code != cli.ExitOK {
		t.Fatalf("keel trace --follow on a terminal: exit %d\n%s", code, screen)
	}
	// What the CLI wrote may still be on its way through the pty: with
	// the terminal's side closed, the reader gets all of it, then an
	// error. (Waiting for the final drawing's first line was not enough:
	// a CI run read the rest after the check.)
	wait(t, ended.seen, "the final waterfall on the terminal")
	tty.Close()
	wait(t, drained, "the rest of the final waterfall on the terminal")
	s := screen.String()
	draws := strings.Split(s, "\x1b[H\x1b[2J")
	if len(draws)-1 < 3 { // draws[0] is what came before the first
		t.Fatalf("keel trace --follow drew %d times, want the waiting run, a redraw and the final one:\n%q", len(draws)-1, s)
	}
	first, last := draws[1], draws[len(draws)-1]
	if !strings.Contains(first, "(agent, waiting)") || !strings.Contains(first, "running") || !strings.Contains(first, ">]") {
		t.Errorf("first drawing: want the run waiting, its open spans running with bars open to now:\n%s", first)
	}
	if !strings.Contains(last, "(agent, succeeded)") || strings.Count(last, "running") != 1 || !strings.Contains(last, "tool.call tally") {
		t.Errorf("last drawing: want the run succeeded, nothing running (running only in the legend), the tool call:\n%s", last)
	}
}

// asyncRun is a command running in the background.
type asyncRun struct {
	seen <-chan struct{} // closed once stderr holds the text waited for
	done <-chan result
}

// keelAsyncErr is keelAsync watching stderr instead of stdout.
func (d *testDaemon) keelAsyncErr(ctx context.Context, want string, args ...string) (*watchWriter, asyncRun) {
	out, errb := newWatchWriter("\x00"), newWatchWriter(want)
	done := make(chan result, 1)
	go func() {
		code := cli.Main(ctx, append(args, "--data-dir", d.dir), out, errb)
		done <- result{code, out, errb.String()}
	}()
	return out, asyncRun{seen: errb.seen, done: done}
}
