package engine

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/models"
)

// TestNewestCutsEndAtALine: a tool result of one item a line (the
// knowledge_search tool's hits, each with its citation) is cut after a
// whole line, never inside one; a result without lines is cut where the
// estimate says.
func TestNewestCutsEndAtALine(t *testing.T) {
	t.Parallel()
	var lines strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&lines, `{"cite":"[%d] notes/n%d.md:1-9","text":"%s"}`+"\n", i, i, strings.Repeat("x", 80))
	}
	flat := strings.Repeat("y", lines.Len())
	for _, tt := range []struct {
		name, content string
		atLine        bool
	}{
		{"lines", lines.String(), true},
		{"one line", flat, false},
	} {
		msgs := []models.Message{{Role: models.RoleSystem}, {Role: models.RoleUser}, {Role: models.RoleAssistant},
			{Role: models.RoleTool, ToolCallID: "c1", Content: tt.content}}
		cuts := newestCuts(msgs, 500, 1)
		if len(cuts) != 1 {
			t.Fatalf("%s: newestCuts = %v, want one cut", tt.name, cuts)
		}
		keep := cuts[0].Keep
		if keep <= 0 || keep >= len(tt.content) {
			t.Fatalf("%s: keep %d of %d bytes", tt.name, keep, len(tt.content))
		}
		if got := tt.content[keep-1] == '\n'; got != tt.atLine {
			t.Errorf("%s: the kept part ends %q, at a line's end: %v, want %v", tt.name, tt.content[max(0, keep-20):keep], got, tt.atLine)
		}
		// About 500 tokens go, as asked.
		if gone := len(tt.content) - keep; gone < 500*models.BytesPerToken {
			t.Errorf("%s: %d bytes cut, want at least %d", tt.name, gone, 500*models.BytesPerToken)
		}
	}
}
