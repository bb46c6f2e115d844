package ipc

import (
	"context"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// labelParams checks the label names of field and returns them sorted
// without duplicates, as the wire carries a set of labels; nil stays
// nil. A malformed name is invalid params naming field and the label.
func labelParams(field string, labels []string) ([]string, error) {
	if labels == nil {
		return nil, nil
	}
	out, err := keel.NormalizeLabels(labels)
	if err != nil {
		return nil, paramError(field, err.Error())
	}
	if out == nil {
		out = []string{} // an empty list stays a list
	}
	return out, nil
}

// handleRunDeclassify serves run.declassify: a well-formed label, a
// reason that says something, and who decided, by default the client's
// name. Whether the context holds the label is the RunLabels' to say.
func handleRunDeclassify(ctx context.Context, c *conn, p protocol.RunDeclassifyParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case keel.CheckLabel(p.Label) != nil:
		return nil, paramError("label", keel.CheckLabel(p.Label).Error())
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
