package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestProgressPlainPull(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, false, true)
	for _, s := range pullSteps {
		p.set(s.Status, s.Completed, s.Total)
	}
	p.end()
	want := "pulling manifest\npulling 8eeb52dfb3bb (2.0 MB)\nverifying sha256 digest\nsuccess\n"
	if b.String() != want {
		t.Errorf("plain output = %q, want one line per status %q", b.String(), want)
	}
}

func TestProgressPlainCounts(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, false, false)
	for _, n := range []int64{0, 0, 1, 3, 3} {
		p.set("compiling tools", n, 3)
	}
	p.end()
	want := "compiling tools: 0 of 3 done\ncompiling tools: 1 of 3 done\ncompiling tools: 3 of 3 done\n"
	if b.String() != want {
		t.Errorf("plain output = %q, want a line per count %q", b.String(), want)
	}
}

func TestProgressTerminal(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, true, true)
	var frames []string
	for _, s := range pullSteps[:4] {
		p.set(s.Status, s.Completed, s.Total)
		frames = append(frames, b.String())
		b.Reset()
	}
	for i, f := range frames {
		if strings.Contains(f, "\n") || !strings.Contains(f, "\r") {
			t.Errorf("frame %d = %q, want one line redrawn in place (\\r, no newline)", i, f)
		}
	}
	for i, want := range []string{"pulling manifest", "0%", "25%", "100%"} {
		if !strings.Contains(frames[i], want) {
			t.Errorf("frame %d = %q, want it to show %q", i, frames[i], want)
		}
	}
	if !strings.Contains(frames[2], "pulling 8eeb52dfb3bb") || !strings.Contains(frames[2], "MB") {
		t.Errorf("frame 2 = %q, want the layer's status and its bytes", frames[2])
	}
	p.end()
	if s := b.String(); strings.Contains(s, "\n") || strings.Contains(s, "done") {
		t.Errorf("end() wrote %q, want the bar cleared, no new line", s)
	}
}

// TestProgressDuringFailure: a failed install must not claim it validated
// and compiled the tool (it printed "validating and compiling … done"
// before the error).
func TestProgressDuringFailure(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		t.Run(fmt.Sprint("terminal=", terminal), func(t *testing.T) {
			var b bytes.Buffer
			p := newProgress(&b, terminal, false)
			boom := errors.New("boom")
			if err := p.during("validating and compiling nope.wasm", func() error { return boom }); err != boom {
				t.Errorf("during = %v, want the operation's error", err)
			}
			if strings.Contains(b.String(), "done") {
				t.Errorf("progress of a failed operation = %q, want no \"done\"", b.String())
			}
			b.Reset()
			if err := p.during("validating and compiling ok.wasm", func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), "validating and compiling ok.wasm done in ") {
				t.Errorf("progress of a finished operation = %q, want it done", b.String())
			}
		})
	}
}
