package main

import "testing"

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
	}
	for _, tt := range tests {
		if got := count(tt.in); got != tt.want {
			t.Errorf("count(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}
