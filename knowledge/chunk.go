package knowledge

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"
)

// Chunk sizes, in bytes. Consecutive small pieces (declarations,
// paragraphs) are packed into one chunk up to targetChunk; a piece larger
// than maxChunk (a huge function, a long section) is cut at blank lines,
// else at line ends, else inside a line.
const (
	targetChunk = 1500
	maxChunk    = 4000
	// minChunk: a declaration or block of code is a chunk of its own
	// unless it and the chunk before it fit in this much together, so
	// that a function is found as itself; small ones (constants,
	// imports, one-line methods) are packed.
	minChunk   = 300
	maxHeading = 200
)

// chunk is a piece of a document as indexed.
type chunk struct {
	Heading    string
	Start, End int // 1-based lines, inclusive
	Text       string
}

// TypeOf names the type of a file from its name: "markdown", "go", a
// language name for other source code ("c", "python", "javascript",
// "typescript", "rust", "java", "shell", "asm", ...), else "text".
func TypeOf(name string) string {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".md", ".markdown", ".mdx":
		return "markdown"
	case ".go":
		return "go"
	case ".c", ".h":
		return "c"
	case ".cc", ".cpp", ".cxx", ".hpp", ".hh":
		return "cpp"
	case ".py":
		return "python"
	case ".js", ".mjs", ".cjs", ".jsx":
		return "javascript"
	case ".ts", ".tsx", ".mts":
		return "typescript"
	case ".rs":
		return "rust"
	case ".java":
		return "java"
	case ".kt":
		return "kotlin"
	case ".swift":
		return "swift"
	case ".cs":
		return "csharp"
	case ".rb":
		return "ruby"
	case ".php":
		return "php"
	case ".lua":
		return "lua"
	case ".zig":
		return "zig"
	case ".sh", ".bash", ".zsh":
		return "shell"
	case ".s", ".asm":
		return "asm"
	case ".sql":
		return "sql"
	case ".proto":
		return "proto"
	}
	return "text"
}

// isCode reports whether typ is split with the brace heuristic.
func isCode(typ string) bool { return typ != "markdown" && typ != "go" && typ != "text" }

// piece is a byte range of the document with its heading; merge says it
// may be packed with its neighbours, code says only while they are small
// (minChunk).
type piece struct {
	start, end  int
	heading     string
	merge, code bool
}

// chunkDoc splits text of type typ into chunks.
func chunkDoc(typ string, text []byte) []chunk {
	var ps []piece
	switch {
	case typ == "markdown":
		ps = markdownPieces(text)
	case typ == "go":
		ps = goPieces(text)
		if ps == nil {
			ps = codePieces(text)
		}
	case isCode(typ):
		ps = codePieces(text)
	default:
		ps = paragraphPieces(text)
	}
	return assemble(text, pack(text, ps))
}

// lineStarts returns the byte offset of every line's start.
func lineStarts(text []byte) []int {
	ls := []int{0}
	for i, c := range text {
		if c == '\n' && i+1 < len(text) {
			ls = append(ls, i+1)
		}
	}
	return ls
}

// markdownPieces cuts at headings outside code fences; each section's
// heading is its path of headings ("Intro > Install").
func markdownPieces(text []byte) []piece {
	var ps []piece
	var stack []string // heading text per level 1..6, "" when unset
	stack = make([]string, 7)
	fence := ""
	cur := piece{}
	for off := 0; off < len(text); {
		end := bytes.IndexByte(text[off:], '\n')
		if end < 0 {
			end = len(text)
		} else {
			end += off + 1
		}
		line := strings.TrimRight(string(text[off:end]), "\r\n")
		trim := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trim, fence) {
				fence = ""
			}
		case strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~"):
			fence = trim[:3]
		default:
			if lvl := headingLevel(trim); lvl > 0 {
				if off > cur.start {
					cur.end = off
					ps = append(ps, cur)
				}
				stack[lvl] = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(trim[lvl:]), "#"))
				for i := lvl + 1; i < len(stack); i++ {
					stack[i] = ""
				}
				var path []string
				for _, h := range stack[1:] {
					if h != "" {
						path = append(path, h)
					}
				}
				cur = piece{start: off, heading: strings.Join(path, " > ")}
			}
		}
		off = end
	}
	cur.end = len(text)
	if cur.end > cur.start {
		ps = append(ps, cur)
	}
	return ps
}

func headingLevel(line string) int {
	n := 0
	for n < len(line) && line[n] == '#' {
		n++
	}
	if n == 0 || n > 6 || n < len(line) && line[n] != ' ' && line[n] != '\t' {
		return 0
	}
	return n
}

// goPieces cuts a Go file at its top-level declarations (each with its
// doc comment); the package clause and imports come first. nil when the
// file does not parse.
func goPieces(text []byte) []piece {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", text, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil
	}
	tf := fset.File(f.Pos())
	if tf == nil {
		return nil
	}
	off := func(p token.Pos) int { return tf.Offset(p) }
	ps := []piece{{start: 0, heading: "package " + f.Name.Name, merge: true, code: true}}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.IMPORT {
			continue
		}
		start := off(d.Pos())
		var doc *ast.CommentGroup
		switch d := d.(type) {
		case *ast.FuncDecl:
			doc = d.Doc
		case *ast.GenDecl:
			doc = d.Doc
		}
		if doc != nil {
			start = off(doc.Pos())
		}
		// Back to the start of the line.
		for start > 0 && text[start-1] != '\n' {
			start--
		}
		if start <= ps[len(ps)-1].start {
			continue
		}
		ps[len(ps)-1].end = start
		ps = append(ps, piece{start: start, heading: declName(d), merge: true, code: true})
	}
	ps[len(ps)-1].end = len(text)
	return ps
}

func declName(d ast.Decl) string {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv != nil && len(d.Recv.List) > 0 {
			return "func (" + typeName(d.Recv.List[0].Type) + ") " + d.Name.Name
		}
		return "func " + d.Name.Name
	case *ast.GenDecl:
		name := ""
		if len(d.Specs) > 0 {
			switch s := d.Specs[0].(type) {
			case *ast.TypeSpec:
				name = s.Name.Name
			case *ast.ValueSpec:
				if len(s.Names) > 0 {
					name = s.Names[0].Name
				}
			}
		}
		return strings.TrimSpace(d.Tok.String() + " " + name)
	}
	return ""
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return "*" + typeName(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	case *ast.SelectorExpr:
		return typeName(e.X) + "." + e.Sel.Name
	}
	return "?"
}

// codePieces cuts other source code where a blank line meets brace depth
// zero: between functions and blocks in most C-like languages, Python
// and shell. A piece's heading is its first line that is not a comment.
func codePieces(text []byte) []piece {
	var ps []piece
	depth := 0
	cur := piece{merge: true, code: true}
	blank := false
	for off := 0; off < len(text); {
		end := bytes.IndexByte(text[off:], '\n')
		if end < 0 {
			end = len(text)
		} else {
			end += off + 1
		}
		line := text[off:end]
		isBlank := len(bytes.TrimSpace(line)) == 0
		if !isBlank && blank && depth <= 0 && off > cur.start {
			cur.end = off
			ps = append(ps, cur)
			cur = piece{start: off, merge: true, code: true}
		}
		if !isBlank && cur.heading == "" {
			t := strings.TrimSpace(string(line))
			if !strings.HasPrefix(t, "//") && !strings.HasPrefix(t, "#") && !strings.HasPrefix(t, "/*") && !strings.HasPrefix(t, "*") {
				cur.heading = t
			}
		}
		for _, c := range line {
			switch c {
			case '{':
				depth++
			case '}':
				depth--
			}
		}
		blank = isBlank
		off = end
	}
	cur.end = len(text)
	if cur.end > cur.start {
		ps = append(ps, cur)
	}
	return ps
}

// paragraphPieces cuts text at blank lines.
func paragraphPieces(text []byte) []piece {
	var ps []piece
	cur := piece{merge: true}
	blank := false
	for off := 0; off < len(text); {
		end := bytes.IndexByte(text[off:], '\n')
		if end < 0 {
			end = len(text)
		} else {
			end += off + 1
		}
		isBlank := len(bytes.TrimSpace(text[off:end])) == 0
		if !isBlank && blank && off > cur.start {
			cur.end = off
			ps = append(ps, cur)
			cur = piece{start: off, merge: true}
		}
		blank = isBlank
		off = end
	}
	cur.end = len(text)
	if cur.end > cur.start {
		ps = append(ps, cur)
	}
	return ps
}

// pack merges runs of mergeable pieces up to targetChunk and cuts pieces
// larger than maxChunk.
func pack(text []byte, ps []piece) []piece {
	var out []piece
	for _, p := range ps {
		if n := len(out); n > 0 && p.merge && out[n-1].merge && p.end-out[n-1].start <= targetChunk &&
			(!p.code || p.end-out[n-1].start <= minChunk) {
			last := &out[n-1]
			last.end = p.end
			if p.heading != "" {
				if last.heading == "" {
					last.heading = p.heading
				} else if len(last.heading) < maxHeading {
					last.heading += "; " + p.heading
				}
			}
			continue
		}
		if p.end-p.start <= maxChunk {
			out = append(out, p)
			continue
		}
		for _, q := range cut(text, p.start, p.end) {
			out = append(out, piece{start: q[0], end: q[1], heading: p.heading})
		}
	}
	return out
}

// cut splits text[start:end] into ranges of at most maxChunk bytes, at
// the last blank line that fits, else the last line end, else a rune
// boundary.
func cut(text []byte, start, end int) [][2]int {
	var out [][2]int
	for end-start > maxChunk {
		limit := start + maxChunk
		at := -1
		if i := bytes.LastIndex(text[start:limit], []byte("\n\n")); i > maxChunk/4 {
			at = start + i + 2
		} else if i := bytes.LastIndexByte(text[start:limit], '\n'); i > 0 {
			at = start + i + 1
		} else {
			at = limit
			for at > start && !utf8.RuneStart(text[at]) {
				at--
			}
			if at == start {
				at = limit
			}
		}
		out = append(out, [2]int{start, at})
		start = at
	}
	return append(out, [2]int{start, end})
}

// assemble turns pieces into chunks: text trimmed of surrounding blank
// lines (and trailing spaces), empty pieces dropped, 1-based line numbers.
func assemble(text []byte, ps []piece) []chunk {
	ls := lineStarts(text)
	line := func(off int) int { return sort.Search(len(ls), func(i int) bool { return ls[i] > off }) }
	var out []chunk
	for _, p := range ps {
		s, e := p.start, p.end
		// Skip blank lines, keeping the first line's indentation.
		for i := s; i < e; i++ {
			if c := text[i]; c == '\n' {
				s = i + 1
			} else if c != ' ' && c != '\t' && c != '\r' {
				break
			}
		}
		for e > s && (text[e-1] == '\n' || text[e-1] == '\r' || text[e-1] == ' ' || text[e-1] == '\t') {
			e--
		}
		if s == e {
			continue
		}
		h := p.heading
		if len(h) > maxHeading {
			h = h[:maxHeading]
			for len(h) > 0 && !utf8.ValidString(h) {
				h = h[:len(h)-1]
			}
		}
		out = append(out, chunk{Heading: h, Start: line(s), End: line(e - 1), Text: string(text[s:e])})
	}
	return out
}
