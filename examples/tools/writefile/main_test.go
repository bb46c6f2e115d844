package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

func ptr(s string) *string { return &s }

func TestApply(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one two two"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		in       input
		want     output
		wantCode string
		file     string // expected content of in.Path afterwards, when set
	}{
		{"create with dirs", input{Path: "notes/new.txt", Content: ptr("hello")}, output{Path: "notes/new.txt", Bytes: 5, Created: true}, "", "hello"},
		{"overwrite", input{Path: "notes/new.txt", Content: ptr("bye")}, output{Path: "notes/new.txt", Bytes: 3}, "", "bye"},
		{"patch once", input{Path: "a.txt", Old: "one", New: ptr("1")}, output{Path: "a.txt", Bytes: 9, Patched: true}, "", "1 two two"},
		{"patch ambiguous", input{Path: "a.txt", Old: "two", New: ptr("2")}, output{}, "ambiguous", "1 two two"},
		{"patch again fails", input{Path: "a.txt", Old: "one", New: ptr("1")}, output{}, "no_match", "1 two two"},
		{"patch missing file", input{Path: "nope.txt", Old: "x", New: ptr("y")}, output{}, "not_found", ""},
		{"climbing out", input{Path: "../escape.txt", Content: ptr("x")}, output{}, "outside_workspace", ""},
		{"absolute outside", input{Path: "/etc/passwd", Content: ptr("x")}, output{}, "outside_workspace", ""},
		{"neither content nor patch", input{Path: "a.txt"}, output{}, "bad_request", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := apply(dir, tt.in)
			if tt.wantCode != "" {
				te, ok := err.(*toolkit.Error)
				if !ok || te.Code != tt.wantCode {
					t.Fatalf("apply(%+v) = %+v, %v; want error code %s", tt.in, got, err, tt.wantCode)
				}
			} else if err != nil || got != tt.want {
				t.Fatalf("apply(%+v) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if tt.file != "" {
				b, err := os.ReadFile(filepath.Join(dir, tt.in.Path))
				if err != nil || string(b) != tt.file {
					t.Errorf("%s holds %q (%v), want %q", tt.in.Path, b, err, tt.file)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape.txt")); err == nil {
		t.Error("a write escaped the workspace")
	}
}
