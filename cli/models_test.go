package cli

import (
	"bytes"
	"os"
	"path/filepath"
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
