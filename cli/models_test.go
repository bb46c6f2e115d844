package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// pullSteps is a one-layer pull as the daemon reports it.
var pullSteps = []protocol.ModelsPullProgress{
	{Status: "pulling manifest"},
	{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 2_000_000},
	{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 2_000_000, Completed: 500_000},
	{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 2_000_000, Completed: 2_000_000},
	{Status: "verifying sha256 digest"},
	{Status: "success"},
}

func TestPullPrinterPlain(t *testing.T) {
	var b bytes.Buffer
	p := &pullPrinter{w: &b}
	for _, s := range pullSteps {
		p.print(s)
	}
	p.end()
	want := "pulling manifest\npulling 8eeb52dfb3bb (2.0 MB)\nverifying sha256 digest\nsuccess\n"
	if b.String() != want {
		t.Errorf("plain output = %q, want one line per status %q", b.String(), want)
	}
}

func TestPullPrinterTerminal(t *testing.T) {
	var b bytes.Buffer
	p := &pullPrinter{w: &b, terminal: true}
	var frames []string
	for _, s := range pullSteps[:4] {
		p.print(s)
		frames = append(frames, b.String())
		b.Reset()
	}
	for i, f := range frames {
		if !strings.HasPrefix(f, "\r") || !strings.HasSuffix(f, "\x1b[K") || strings.Contains(f, "\n") {
			t.Errorf("frame %d = %q, want one line redrawn in place (\\r … \\x1b[K, no newline)", i, f)
		}
	}
	for i, want := range []string{"pulling manifest", "0% [" + strings.Repeat(" ", barWidth) + "] 0 B/2.0 MB", "25% [======", "100% [" + strings.Repeat("=", barWidth) + "] 2.0 MB/2.0 MB"} {
		if !strings.Contains(frames[i], want) {
			t.Errorf("frame %d = %q, want it to show %q", i, frames[i], want)
		}
	}
	if !strings.Contains(frames[2], "pulling 8eeb52dfb3bb") || !strings.Contains(frames[2], "500.0 kB/2.0 MB") {
		t.Errorf("frame 2 = %q, want the layer's status and bytes done/total", frames[2])
	}
	p.end()
	if b.String() != "\n" {
		t.Errorf("end() wrote %q, want the line closed with a newline", b.String())
	}
}

func TestIsTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) || isTerminal(&bytes.Buffer{}) {
		t.Error("isTerminal(a file or a buffer) = true, want false")
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{999, "999 B"},
		{1000, "1.0 kB"},
		{1_500_000, "1.5 MB"},
		{397_807_936, "397.8 MB"},
		{4_700_000_000, "4.7 GB"},
	}
	for _, tt := range tests {
		if got := formatBytes(tt.n); got != tt.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
