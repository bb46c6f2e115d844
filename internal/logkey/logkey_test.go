package logkey_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// logger matches the receivers of log calls: log, e.log, r.log, logger.
var logger = regexp.MustCompile(`(?i)(^|\.)log(ger)?$`)

// TestKeysAreConstants: no log call in keel's own code (tests, benches and
// examples aside) spells an attribute key as a string literal; every key
// is one of this package's constants, so one key means one thing across
// packages.
func TestKeysAreConstants(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "bench", "examples", "testdata", ".git":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		for _, lit := range literalKeys(f) {
			t.Errorf("%s: log attribute key %s is a literal; use a logkey constant", fset.Position(lit.Pos()), lit.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d files; the walk missed the tree", checked)
	}
}

// literalKeys returns the string literals f passes as attribute keys:
// the first argument of slog.String and its kin, and the keys of the
// key-value pairs of a logger's Debug, Info, Warn, Error, Log and With.
func literalKeys(f *ast.File) []*ast.BasicLit {
	var lits []*ast.BasicLit
	key := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			lits = append(lits, lit)
		}
	}
	pairs := func(args []ast.Expr, start int) {
		for i := start; i < len(args); {
			if isSlogCall(args[i]) {
				i++ // an Attr stands alone
				continue
			}
			key(args[i])
			i += 2
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if isSlogCall(c) {
			switch sel.Sel.Name {
			case "String", "Int", "Int64", "Uint64", "Float64", "Bool", "Duration", "Time", "Any", "Group":
				if len(c.Args) > 0 {
					key(c.Args[0])
				}
			}
			return true
		}
		if !logger.MatchString(exprString(sel.X)) {
			return true
		}
		switch sel.Sel.Name {
		case "Debug", "Info", "Warn", "Error":
			pairs(c.Args, 1)
		case "With":
			pairs(c.Args, 0)
		case "Log":
			pairs(c.Args, 3)
		}
		return true
	})
	return lits
}

func isSlogCall(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "slog"
}

// exprString renders a receiver such as f.e.log.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return ""
}
