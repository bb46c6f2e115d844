package ipc

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestProtocolDocListsEveryMethod: docs/protocol.md documents exactly the
// methods the server registers: its methods table, a section for each,
// and the method list of initialize's example (issue 13, item 13: the
// table lacked six methods and the example listed 10 of 29).
func TestProtocolDocListsEveryMethod(t *testing.T) {
	raw, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	var registered []string
	for name := range methods {
		registered = append(registered, name)
	}
	slices.Sort(registered)

	// The table: rows of "| [`a`, `b`](#anchor) | params | result |"
	// between "## Methods" and the next blank line.
	_, after, ok := strings.Cut(doc, "\n## Methods\n")
	if !ok {
		t.Fatal("protocol.md has no \"## Methods\" section")
	}
	table, _, _ := strings.Cut(strings.TrimLeft(after, "\n"), "\n\n")
	name := regexp.MustCompile("`([a-z][a-z_.]*)`")
	var tabled []string
	for _, row := range strings.Split(table, "\n")[2:] {
		cell := strings.SplitN(row, "|", 3)
		if len(cell) < 3 {
			t.Fatalf("methods table row %q is not a table row", row)
		}
		for _, m := range name.FindAllStringSubmatch(cell[1], -1) {
			tabled = append(tabled, m[1])
		}
	}
	same(t, "the methods table of protocol.md", tabled, registered)

	// A section for each: "### a" or "### a, b".
	var sections []string
	for _, h := range regexp.MustCompile(`(?m)^### ([a-z][a-z_.]*(?:, [a-z][a-z_.]*)*)$`).FindAllStringSubmatch(doc, -1) {
		for _, m := range strings.Split(h[1], ", ") {
			if _, ok := methods[m]; ok {
				sections = append(sections, m)
			}
		}
	}
	for _, m := range registered {
		if !slices.Contains(sections, m) {
			t.Errorf("protocol.md has no ### section for %s", m)
		}
	}

	// initialize's example lists every method, sorted.
	ex := regexp.MustCompile(`(?s)"methods":(\[[^\]]*\])`).FindStringSubmatch(doc)
	if ex == nil {
		t.Fatal("protocol.md's initialize example lists no methods")
	}
	var listed []string
	if err := json.Unmarshal([]byte(ex[1]), &listed); err != nil {
		t.Fatalf("initialize example methods %s: %v", ex[1], err)
	}
	if !slices.IsSorted(listed) {
		t.Errorf("initialize example methods are not sorted: %v", listed)
	}
	same(t, "initialize's example in protocol.md", listed, registered)
}

// same reports the names in doc but not registered and the other way.
func same(t *testing.T, where string, doc, registered []string) {
	t.Helper()
	for _, m := range registered {
		if !slices.Contains(doc, m) {
			t.Errorf("%s lacks method %s, which the server registers", where, m)
		}
	}
	for _, m := range doc {
		if _, ok := methods[m]; !ok {
			t.Errorf("%s names method %s, which the server does not register", where, m)
		}
	}
	seen := map[string]bool{}
	for _, m := range doc {
		if seen[m] {
			t.Errorf("%s names method %s twice", where, m)
		}
		seen[m] = true
	}
}
