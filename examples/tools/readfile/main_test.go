package main

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

func TestReadFile(t *testing.T) {
	fsys := fstest.MapFS{
		"notes.txt":     {Data: []byte("hello\n")},
		"sub/deep.txt":  {Data: []byte("deep")},
		"long.txt":      {Data: []byte(strings.Repeat("a", 10) + "é")}, // é is 2 bytes
		"binary.bin":    {Data: []byte{'a', 0, 'b'}},
		"sub/other.txt": {Data: []byte("x")},
	}
	tests := []struct {
		name     string
		in       input
		want     output
		wantCode string
	}{
		{"relative", input{Path: "notes.txt"}, output{Path: "notes.txt", Content: "hello\n"}, ""},
		{"absolute inside", input{Path: "/workspace/sub/deep.txt"}, output{Path: "sub/deep.txt", Content: "deep"}, ""},
		{"dot segments inside", input{Path: "sub/../notes.txt"}, output{Path: "notes.txt", Content: "hello\n"}, ""},
		{"truncated", input{Path: "notes.txt", MaxBytes: 3}, output{Path: "notes.txt", Content: "hel", Truncated: true}, ""},
		{"truncation keeps runes whole", input{Path: "long.txt", MaxBytes: 11}, output{Path: "long.txt", Content: strings.Repeat("a", 10), Truncated: true}, ""},
		{"missing", input{Path: "nope.txt"}, output{}, "not_found"},
		{"climbing out", input{Path: "../../etc/passwd"}, output{}, "outside_workspace"},
		{"absolute outside", input{Path: "/etc/passwd"}, output{}, "outside_workspace"},
		{"prefix is not a parent", input{Path: "/workspace2/x"}, output{}, "outside_workspace"},
		{"directory", input{Path: "sub"}, output{}, "is_directory"},
		{"root itself", input{Path: "/workspace"}, output{}, "is_directory"},
		{"binary", input{Path: "binary.bin"}, output{}, "not_text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readFile(fsys, tt.in)
			if tt.wantCode != "" {
				te, ok := err.(*toolkit.Error)
				if !ok || te.Code != tt.wantCode {
					t.Fatalf("readFile(%+v) = %+v, %v; want error code %s", tt.in, got, err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("readFile(%+v) error: %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("readFile(%+v) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}
