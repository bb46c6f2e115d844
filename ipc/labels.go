package ipc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// maxLabel is the longest label name (policy.ParseLabel's bound).
const maxLabel = 64

// checkLabel reports why s is not a label name, or "" if it is one: a
// lower-case letter, then lower-case letters, digits, '-' or '_', at
// most maxLabel bytes. It is the grammar of policy.ParseLabel, which
// this package may not import (a test keeps the two in step).
func checkLabel(s string) string {
	if s == "" {
		return "a label must not be empty"
	}
	bad := len(s) > maxLabel || s[0] < 'a' || s[0] > 'z'
	for i := 1; i < len(s) && !bad; i++ {
		c := s[i]
		bad = !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_')
	}
	if bad {
		return fmt.Sprintf("%q is not a label: want a lower-case letter, then letters, digits, - or _ (at most %d)", s, maxLabel)
	}
	return ""
}

// labelParams checks the label names of field and returns them sorted
// without duplicates, as the wire carries a set of labels; nil stays
// nil. A malformed name is invalid params naming field and the label.
func labelParams(field string, labels []string) ([]string, error) {
	if labels == nil {
		return nil, nil
	}
	for _, l := range labels {
		if problem := checkLabel(l); problem != "" {
			return nil, paramError(field, problem)
		}
	}
	out := slices.Clone(labels)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// handleRunDeclassify serves run.declassify: a well-formed label, a
// reason that says something, and who decided, by default the client's
// name. Whether the context holds the label is the RunLabels' to say.
func handleRunDeclassify(ctx context.Context, c *conn, p protocol.RunDeclassifyParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case checkLabel(p.Label) != "":
		return nil, paramError("label", checkLabel(p.Label))
	case strings.TrimSpace(p.Reason) == "":
		return nil, paramError("reason", "must say why the label may be cleared")
	case p.By != "" && strings.TrimSpace(p.By) == "":
		return nil, paramError("by", "must not be blank; omit it to record the client's name")
	}
	if p.By == "" {
		p.By = strings.TrimSpace(c.clientName())
	}
	if p.By == "" {
		p.By = protocol.DeclassifiedByDefault
	}
	return c.s.svc.Labels.Declassify(ctx, p)
}
