package main

import (
	"strings"
	"testing"
	"testing/quick"
	"unicode/utf8"
)

func TestCount(t *testing.T) {
	tests := []struct {
		in   string
		want output
	}{
		{"", output{}},
		{"one", output{Words: 1, Lines: 1, Chars: 3}},
		{"hello world\n", output{Words: 2, Lines: 1, Chars: 12}},
		{"a b\nc\n\nd", output{Words: 4, Lines: 4, Chars: 8}},
		{"  spaced\tout  \n", output{Words: 2, Lines: 1, Chars: 15}},
		{"héllo wörld", output{Words: 2, Lines: 1, Chars: 11}},
		{"\n\n", output{Lines: 2, Chars: 2}},
		{"a\u00a0b\u2003c", output{Words: 3, Lines: 1, Chars: 5}}, // Unicode spaces separate words
		{"bad\xffbyte x", output{Words: 2, Lines: 1, Chars: 10}},  // a byte that is not UTF-8 is a character of a word
	}
	for _, tt := range tests {
		if got := count(tt.in); got != tt.want {
			t.Errorf("count(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

// TestCountAgreesWithTheLibrary: the one-pass count says what
// strings.Fields, strings.Count and utf8.RuneCountInString say, for any
// text.
func TestCountAgreesWithTheLibrary(t *testing.T) {
	agrees := func(s string) bool {
		lines := strings.Count(s, "\n")
		if s != "" && !strings.HasSuffix(s, "\n") {
			lines++
		}
		return count(s) == output{Words: len(strings.Fields(s)), Lines: lines, Chars: utf8.RuneCountInString(s)}
	}
	if err := quick.Check(agrees, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
	for _, s := range []string{" \t\v\f\r\n\u0085\u00a0 x", "\xe2\x80", "a\u3000b", "\u200bzero-width", "x\xff\xfe y"} {
		if !agrees(s) {
			t.Errorf("count(%q) = %+v disagrees with the library", s, count(s))
		}
	}
}
