package ipc

import (
	"strings"
	"testing"

	"github.com/keel-runtime/keel/policy"
)

// FuzzCheckLabel: the protocol edge accepts exactly the label names
// package policy accepts (ipc may not import it, so the grammar is
// written twice; this keeps them in step).
func FuzzCheckLabel(f *testing.F) {
	for _, s := range []string{"", "pii", "private", "secret", "hr-data", "a_1", "PII", "Pii", "1abc", "-x", "a b", "ü", "a.b",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := policy.ParseLabel(s)
		if got := checkLabel(s) == ""; got != (err == nil) {
			t.Errorf("checkLabel(%q) accepts = %v, policy.ParseLabel(%q) err = %v", s, got, s, err)
		}
	})
}

func TestLabelParams(t *testing.T) {
	got, err := labelParams("labels", []string{"private", "pii", "private"})
	if err != nil || strings.Join(got, ",") != "pii,private" {
		t.Errorf("labelParams(private pii private) = %v, %v; want [pii private]", got, err)
	}
	if got, err := labelParams("labels", nil); got != nil || err != nil {
		t.Errorf("labelParams(nil) = %v, %v; want nil, nil", got, err)
	}
	if _, err := labelParams("policy.labels", []string{"pii", "Nope"}); err == nil || !strings.Contains(err.Error(), `policy.labels: "Nope" is not a label`) {
		t.Errorf("labelParams(pii Nope) err = %v, want the field and the label named", err)
	}
}
