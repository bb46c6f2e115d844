package ipc

import (
	"strings"
	"testing"
)

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
