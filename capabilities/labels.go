package capabilities

import (
	"errors"
	"fmt"
	"slices"
)

// LabelPrivate is the label FSGrant.Private stands for.
const LabelPrivate = "private"

// ErrLabel is wrapped by the error of a malformed label name.
var ErrLabel = errors.New("invalid label")

// CheckLabel reports whether s is a label name: a lower-case letter, then
// lower-case letters, digits, - or _, at most 64 bytes in all. It is the
// rule of package policy (policy.ParseLabel), which capabilities, being
// below it, cannot import. The error wraps ErrLabel.
func CheckLabel(s string) error {
	ok := len(s) > 0 && len(s) <= 64 && s[0] >= 'a' && s[0] <= 'z'
	for i := 1; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("%w %q: want a lower-case letter then letters, digits, - or _ (at most 64)", ErrLabel, s)
	}
	return nil
}

// NormalizeLabels checks every label of ls (CheckLabel) and returns them
// sorted without duplicates; nil when ls is empty. ls is not modified.
func NormalizeLabels(ls []string) ([]string, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	for _, l := range ls {
		if err := CheckLabel(l); err != nil {
			return nil, err
		}
	}
	out := slices.Clone(ls)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// UnionLabels returns the labels of a and b, sorted without duplicates;
// nil when both are empty. Neither is modified.
func UnionLabels(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]string, 0, len(a)+len(b))
	out = append(append(out, a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
