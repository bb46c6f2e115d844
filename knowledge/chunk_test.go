package knowledge

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// brief is a chunk without its text: heading and lines.
type brief struct {
	Heading    string
	Start, End int
}

func briefs(cs []chunk) []brief {
	var out []brief
	for _, c := range cs {
		out = append(out, brief{c.Heading, c.Start, c.End})
	}
	return out
}

func TestChunkMarkdown(t *testing.T) {
	t.Parallel()
	doc := strings.Join([]string{
		"Preamble.", // 1
		"",
		"# Guide", // 3
		"Intro.",
		"## Install", // 5
		"```sh",
		"# not a heading",
		"go install",
		"```",
		"### Linux ###", // 10
		"apt",
		"## Use", // 12
		"####### seven hashes is text",
		"#no space is text",
		"# Other", // 15
		"end",
	}, "\n")
	want := []brief{
		{"", 1, 1},
		{"Guide", 3, 4},
		{"Guide > Install", 5, 9},
		{"Guide > Install > Linux", 10, 11},
		{"Guide > Use", 12, 14},
		{"Other", 15, 16},
	}
	if diff := cmp.Diff(want, briefs(chunkDoc("markdown", []byte(doc)))); diff != "" {
		t.Errorf("chunkDoc(markdown) mismatch (-want +got):\n%s", diff)
	}
}

func TestChunkGo(t *testing.T) {
	t.Parallel()
	big := "func Big() {\n" + strings.Repeat("\tx := 1\n\t_ = x\n\n", 400) + "}\n"
	src := `// Package p is a test.
package p

import "fmt"

const A = 1

// T is a type.
type T struct{}

// Method does things at length, with a doc comment long enough that it is
// not packed with its neighbours: two lines and then a body of some size
// that says what the method does and prints it.
func (t *T) Method() {
	fmt.Println("method", "with", "a", "body", "of", "some", "length")
}

func Tiny() {}

` + big
	got := chunkDoc("go", []byte(src))
	want := []brief{
		{"package p; const A; type T", 1, 9},
		{"func (*T) Method", 11, 16},
		{"func Tiny", 18, 18},
	}
	b := briefs(got)
	if len(b) < len(want) {
		t.Fatalf("chunkDoc(go) = %+v, want at least %+v", b, want)
	}
	if diff := cmp.Diff(want, b[:len(want)]); diff != "" {
		t.Errorf("chunkDoc(go) mismatch (-want +got):\n%s", diff)
	}
	// The big function is cut in pieces of at most maxChunk, at blank lines, all headed Big.
	rest := got[len(want):]
	if len(rest) < 2 {
		t.Fatalf("chunkDoc(go): big function in %d chunks, want it cut", len(rest))
	}
	var joined []string
	for _, c := range rest {
		if c.Heading != "func Big" || len(c.Text) > maxChunk || strings.HasPrefix(c.Text, "\n") {
			t.Errorf("chunk of Big: heading %q, %d bytes, starts %q; want func Big, at most %d bytes, cut at a blank line", c.Heading, len(c.Text), c.Text[:10], maxChunk)
		}
		joined = append(joined, c.Text)
	}
	if rest[0].Start != 20 || rest[len(rest)-1].End != strings.Count(src, "\n") {
		t.Errorf("Big's chunks span lines %d-%d, want 20-%d", rest[0].Start, rest[len(rest)-1].End, strings.Count(src, "\n"))
	}
	if got := strings.Join(joined, "\n\n") + "\n"; got != big {
		t.Errorf("Big's chunks joined differ from the function")
	}

	// A file that does not parse falls back to the code heuristic.
	bad := "package p\n\nfunc A() {\n\tif {\n}\n\nfunc B() {}\n"
	if got := chunkDoc("go", []byte(bad)); len(got) == 0 || got[0].Start != 1 {
		t.Errorf("chunkDoc(go, unparsable) = %+v, want chunks from line 1", briefs(got))
	}
}

func TestChunkCode(t *testing.T) {
	t.Parallel()
	fn := func(name string) string {
		return "int " + name + "(int x) {\n\tint y = x;\n\n\ty = y * 2; /* a blank line inside braces does not cut */\n" +
			strings.Repeat("\ty = y + 1;\n", 20) + "\treturn y;\n}\n"
	}
	src := "// header comment\n#include <stdio.h>\n\n" + fn("alpha") + "\n" + fn("beta")
	got := briefs(chunkDoc("c", []byte(src)))
	want := []brief{
		{"", 1, 2}, // "#..." is a comment to the heuristic
		{"int alpha(int x) {", 4, 29},
		{"int beta(int x) {", 31, 56},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chunkDoc(c) mismatch (-want +got):\n%s", diff)
	}
}

func TestChunkTextCut(t *testing.T) {
	t.Parallel()
	// One line of 10,000 multi-byte runes: cut inside the line, on rune boundaries.
	long := strings.Repeat("é", 10000)
	got := chunkDoc("text", []byte(long))
	total := 0
	for _, c := range got {
		if len(c.Text) > maxChunk || !utf8.ValidString(c.Text) || c.Start != 1 || c.End != 1 {
			t.Errorf("chunk of a long line: %d bytes, valid %v, lines %d-%d; want at most %d, valid UTF-8, line 1", len(c.Text), utf8.ValidString(c.Text), c.Start, c.End, maxChunk)
		}
		total += len(c.Text)
	}
	if total != len(long) {
		t.Errorf("chunks of a long line hold %d bytes, want %d", total, len(long))
	}
	// Paragraphs are packed up to targetChunk.
	para := strings.Repeat("word ", 80) + "\n\n" // 402 bytes
	got = chunkDoc("text", []byte(strings.Repeat(para, 6)))
	if len(got) != 2 {
		t.Errorf("chunkDoc(6 paragraphs of 400 bytes) = %d chunks, want 2 (packed to %d)", len(got), targetChunk)
	}
	if got := chunkDoc("text", []byte("\n\n  \n")); len(got) != 0 {
		t.Errorf("chunkDoc(blank) = %+v, want none", got)
	}
}

func TestTypeOf(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"a.md": "markdown", "b.GO": "go", "c.py": "python", "d": "text", "e.txt": "text", "f.s": "asm"} {
		if got := TypeOf(name); got != want {
			t.Errorf("TypeOf(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestMatchExpr(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"How do I parse a file?":  `"parse" OR "file"`,
		`"x" AND y* NEAR(z)`:      `"x" OR "y" OR "near" OR "z"`,
		"the":                     `"the"`,
		"":                        "",
		"read_file ReadFile 2024": `"read_file" OR "readfile" OR "2024"`,
	} {
		if got := matchExpr(in); got != want {
			t.Errorf("matchExpr(%q) = %s, want %s", in, got, want)
		}
		if got, want := matchAll(in), strings.ReplaceAll(want, " OR ", " AND "); got != want {
			t.Errorf("matchAll(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestFuse(t *testing.T) {
	t.Parallel()
	h := func(row int64) Hit { return Hit{row: row} }
	bm := []Hit{h(1), h(2), h(3)}
	vec := []Hit{h(3), h(4), h(5)}
	got := fuse(bm, vec)
	var rows []int64
	for _, x := range got {
		rows = append(rows, x.row)
	}
	// 3: 1/63 + 1/61 beats 1: 1/61; 2 (1/62) ties 4 (1/62): BM25's first.
	if want := []int64{3, 1, 2, 4, 5}; !cmp.Equal(rows, want) {
		t.Errorf("fuse() order = %v, want %v", rows, want)
	}
	if got[0].BM25Rank != 3 || got[0].VectorRank != 1 || got[3].BM25Rank != 0 || got[3].VectorRank != 2 {
		t.Errorf("fuse() ranks = %+v, want 3 at 3/1 and 4 at 0/2", got)
	}
}
