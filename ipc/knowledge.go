package ipc

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// The knowledge.* methods: the server checks what their params must
// hold; the Knowledge service checks scopes and does the work.

// knowledgeBy names who asks, for the provenance of what is added.
func knowledgeBy(c *conn) string {
	if n := c.clientName(); n != "" {
		return "client:" + n
	}
	return "client"
}

// absPaths checks that every path is absolute: they are read on the
// daemon's machine, whose working directory is not the client's.
func absPaths(field string, paths []string) error {
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return paramError(field, "must be absolute paths (read on the daemon's machine); "+p+" is not")
		}
	}
	return nil
}

// handleKnowledgeAdd indexes paths, sending its progress to this
// connection as knowledge.add.progress notifications carrying the
// request's id, all before the response.
func handleKnowledgeAdd(ctx context.Context, c *conn, p protocol.KnowledgeAddParams) (any, error) {
	if len(p.Paths) == 0 {
		return nil, paramError("paths", "must name at least one file or directory")
	}
	if err := absPaths("paths", p.Paths); err != nil {
		return nil, err
	}
	labels, err := labelParams("labels", p.Labels)
	if err != nil {
		return nil, err
	}
	p.Labels = labels
	id := requestID(ctx)
	progress := func(protocol.KnowledgeProgress) {}
	if id != nil {
		progress = func(pr protocol.KnowledgeProgress) {
			pr.ID = id
			// Fails only when the connection has ended, which cancels
			// ctx and so the add.
			_ = c.notify(ctx, protocol.NotifyKnowledgeAddProgress, pr)
		}
	}
	res, err := c.s.svc.Knowledge.AddKnowledge(ctx, p, knowledgeBy(c), progress)
	if err != nil {
		return nil, err
	}
	res.Skipped = nonNil(res.Skipped)
	return res, nil
}

func handleKnowledgeRemember(ctx context.Context, c *conn, p protocol.KnowledgeRememberParams) (any, error) {
	if p.RunID == "" {
		return nil, paramError("run_id", "must not be empty")
	}
	return c.s.svc.Knowledge.RememberRun(ctx, p, knowledgeBy(c))
}

func handleKnowledgeSearch(ctx context.Context, c *conn, p protocol.KnowledgeSearchParams) (any, error) {
	switch {
	case strings.TrimSpace(p.Query) == "":
		return nil, paramError("query", "must not be empty")
	case p.Limit < 0 || p.Limit > 100:
		return nil, paramError("limit", "must be between 0 and 100")
	}
	res, err := c.s.svc.Knowledge.SearchKnowledge(ctx, p)
	if err != nil {
		return nil, err
	}
	res.Hits = nonNil(res.Hits)
	return res, nil
}

func handleKnowledgeForget(ctx context.Context, c *conn, p protocol.KnowledgeForgetParams) (any, error) {
	n := 0
	for _, s := range []string{p.Path, p.ID, p.Scope} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return nil, paramError("path", "name exactly one of path, id and scope")
	}
	if p.Path != "" {
		if err := absPaths("path", []string{p.Path}); err != nil {
			return nil, err
		}
	}
	return c.s.svc.Knowledge.ForgetKnowledge(ctx, p)
}

func handleKnowledgeWatch(ctx context.Context, c *conn, p protocol.KnowledgeWatchParams) (any, error) {
	if p.Dir == "" {
		return nil, paramError("dir", "must not be empty")
	}
	if err := absPaths("dir", []string{p.Dir}); err != nil {
		return nil, err
	}
	labels, err := labelParams("labels", p.Labels)
	if err != nil {
		return nil, err
	}
	p.Labels = labels
	return c.s.svc.Knowledge.WatchKnowledge(ctx, p, knowledgeBy(c))
}

func handleKnowledgeUnwatch(ctx context.Context, c *conn, p protocol.KnowledgeUnwatchParams) (any, error) {
	if p.Dir == "" {
		return nil, paramError("dir", "must not be empty")
	}
	if err := absPaths("dir", []string{p.Dir}); err != nil {
		return nil, err
	}
	if err := c.s.svc.Knowledge.UnwatchKnowledge(ctx, p); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func handleKnowledgeLabels(ctx context.Context, c *conn, p protocol.KnowledgeLabelsParams) (any, error) {
	if p.Scope == "" {
		return nil, paramError("scope", "must not be empty")
	}
	labels, err := labelParams("labels", p.Labels)
	if err != nil {
		return nil, err
	}
	if labels == nil {
		labels = []string{}
	}
	p.Labels = labels
	return c.s.svc.Knowledge.LabelScope(ctx, p)
}
