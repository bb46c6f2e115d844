package recall

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/knowledge"
)

// Service serves the knowledge.* protocol methods (ipc.Knowledge) over
// an Index, with a Watcher for knowledge.watch. Index and Runs are
// required; without Watcher, knowledge.watch fails. Safe for concurrent
// use.
type Service struct {
	Index   *knowledge.Index
	Watcher *Watcher
	// Runs returns a run, for knowledge.remember.
	Runs func(ctx context.Context, id keel.RunID) (keel.Run, error)
	// ContextLabels returns the labels a run's context holds
	// (engine.Engine.ContextLabels): a remembered outcome carries them.
	ContextLabels func(ctx context.Context, id keel.RunID) ([]string, error)
}

// scope parses a scope of the protocol, wrapping keel.ErrInvalid.
func scope(field, s string) (knowledge.Scope, error) {
	sc, err := knowledge.ParseScope(s)
	if err != nil {
		return "", fmt.Errorf("%s %q: want user, workspace:ROOT or run:ID: %w", field, s, keel.ErrInvalid)
	}
	return sc, nil
}

// storeErr maps the store's errors to the protocol's.
func storeErr(err error) error {
	switch {
	case errors.Is(err, knowledge.ErrScope) && !errors.Is(err, keel.ErrInvalid):
		return fmt.Errorf("%w: %w", err, keel.ErrInvalid)
	case errors.Is(err, knowledge.ErrCheckpointBusy):
		return fmt.Errorf("%w; forget again once the daemon is less busy to truncate it: %w", err, keel.ErrUnavailable)
	}
	return err
}

// AddKnowledge implements ipc.Knowledge.
func (s *Service) AddKnowledge(ctx context.Context, p protocol.KnowledgeAddParams, by string, progress func(protocol.KnowledgeProgress)) (protocol.KnowledgeAddResult, error) {
	sc, err := scope("scope", p.Scope)
	if err != nil {
		return protocol.KnowledgeAddResult{}, err
	}
	rep, err := s.Index.Add(ctx, p.Paths, knowledge.AddOptions{Scope: sc, Labels: p.Labels, AddedBy: by, Progress: func(pr knowledge.Progress) {
		progress(protocol.KnowledgeProgress{Files: pr.Files, FilesDone: pr.FilesDone, Chunks: pr.Chunks, Embedded: pr.Embedded, Path: pr.Path})
	}})
	if err != nil {
		return protocol.KnowledgeAddResult{}, storeErr(err)
	}
	return addResult(sc, rep), nil
}

func addResult(sc knowledge.Scope, rep knowledge.AddReport) protocol.KnowledgeAddResult {
	res := protocol.KnowledgeAddResult{Scope: string(sc), Added: rep.Added, Updated: rep.Updated, Unchanged: rep.Unchanged, Forgotten: rep.Forgotten, Chunks: rep.Chunks, Skipped: []protocol.KnowledgeSkip{}}
	for _, sk := range rep.Skipped {
		res.Skipped = append(res.Skipped, protocol.KnowledgeSkip{Path: sk.Path, Reason: sk.Reason})
	}
	return res
}

// RunSource is the provenance of a run's remembered outcome.
func RunSource(id keel.RunID) string { return "keel:run/" + string(id) }

// RememberRun implements ipc.Knowledge: the outcome of an ended run (its
// goal, status, and result or error) is saved as text into the scope
// (by default the run's workspace's, else user), replacing what an
// earlier remember of the run saved. The labels the run's context held
// join the scope's: what came from private data makes the scope private.
func (s *Service) RememberRun(ctx context.Context, p protocol.KnowledgeRememberParams, by string) (protocol.KnowledgeDoc, error) {
	run, err := s.Runs(ctx, p.RunID)
	if err != nil {
		return protocol.KnowledgeDoc{}, err
	}
	if !run.Status.Terminal() {
		return protocol.KnowledgeDoc{}, fmt.Errorf("run %s is %s: remember it once it has ended: %w", run.ID, run.Status, keel.ErrConflict)
	}
	sc := ScopeUser
	if run.Workspace != "" {
		sc = WorkspaceScope(run.Workspace)
	}
	if p.Scope != "" {
		if sc, err = scope("scope", p.Scope); err != nil {
			return protocol.KnowledgeDoc{}, err
		}
	}
	var labels []string
	if s.ContextLabels != nil {
		if labels, err = s.ContextLabels(ctx, run.ID); err != nil {
			return protocol.KnowledgeDoc{}, err
		}
	}
	if len(labels) > 0 {
		if err := s.joinLabels(ctx, sc, labels); err != nil {
			return protocol.KnowledgeDoc{}, err
		}
	}
	doc, err := s.Index.AddText(ctx, RunSource(run.ID), "run", Outcome(run), knowledge.AddOptions{Scope: sc, Labels: labels, AddedBy: by})
	if err != nil {
		return protocol.KnowledgeDoc{}, storeErr(err)
	}
	return docOut(doc), nil
}

// joinLabels adds labels to scope sc's, when it has some already.
func (s *Service) joinLabels(ctx context.Context, sc knowledge.Scope, labels []string) error {
	infos, err := s.Index.Scopes(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(infos, func(si knowledge.ScopeInfo) bool { return si.Name == sc })
	if i < 0 {
		return nil // a new scope takes them from the add
	}
	have := infos[i].Labels
	joined := slices.Clone(have)
	for _, l := range labels {
		if !slices.Contains(joined, l) {
			joined = append(joined, l)
		}
	}
	if len(joined) == len(have) {
		return nil
	}
	slices.Sort(joined)
	return s.Index.SetScopeLabels(ctx, sc, joined)
}

// Outcome is the text a remembered run is saved as.
func Outcome(run keel.Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Outcome of keel run %s\n\n", run.ID)
	fmt.Fprintf(&b, "Goal: %s\n", run.Goal)
	fmt.Fprintf(&b, "Status: %s (%s, model %s)\n", run.Status, run.UpdatedAt.UTC().Format("2006-01-02 15:04 UTC"), run.Model)
	if run.Workspace != "" {
		fmt.Fprintf(&b, "Workspace: %s\n", run.Workspace)
	}
	if run.Result != "" {
		fmt.Fprintf(&b, "\n## Result\n\n%s\n", run.Result)
	}
	if run.Error != "" {
		fmt.Fprintf(&b, "\n## Error\n\n%s\n", run.Error)
	}
	return b.String()
}

func docOut(d knowledge.Doc) protocol.KnowledgeDoc {
	labels := d.Labels
	if labels == nil {
		labels = []string{}
	}
	return protocol.KnowledgeDoc{ID: d.ID, Source: d.Source, Type: d.Type, Scope: string(d.Scope), Labels: labels, Hash: d.Hash,
		AddedBy: d.AddedBy, ModTime: d.ModTime, AddedAt: d.AddedAt, Chunks: d.Chunks, Bytes: d.Bytes}
}

// SearchKnowledge implements ipc.Knowledge: every scope when none is
// named (a client of the protocol is the user, whose store it is; its
// token's read scope is what it needs).
func (s *Service) SearchKnowledge(ctx context.Context, p protocol.KnowledgeSearchParams) (protocol.KnowledgeSearchResult, error) {
	var scopes []knowledge.Scope
	for _, n := range p.Scopes {
		sc, err := scope("scopes", n)
		if err != nil {
			return protocol.KnowledgeSearchResult{}, err
		}
		scopes = append(scopes, sc)
	}
	if len(scopes) == 0 {
		infos, err := s.Index.Scopes(ctx)
		if err != nil {
			return protocol.KnowledgeSearchResult{}, err
		}
		for _, si := range infos {
			scopes = append(scopes, si.Name)
		}
		if len(scopes) == 0 {
			return protocol.KnowledgeSearchResult{Hits: []protocol.KnowledgeHit{}}, nil
		}
	}
	hits, err := s.Index.Search(ctx, knowledge.Query{Text: p.Query, Scopes: scopes, PathPrefix: p.PathPrefix, Type: p.Type, Limit: p.Limit})
	if err != nil {
		return protocol.KnowledgeSearchResult{}, storeErr(err)
	}
	res := protocol.KnowledgeSearchResult{Hits: make([]protocol.KnowledgeHit, 0, len(hits))}
	for i, h := range hits {
		labels := h.Labels
		if labels == nil {
			labels = []string{}
		}
		res.Hits = append(res.Hits, protocol.KnowledgeHit{N: i + 1, Cite: Cite(i+1, h), Source: h.Source, StartLine: h.StartLine, EndLine: h.EndLine,
			Heading: h.Heading, Type: h.Type, Scope: string(h.Scope), Labels: labels, Score: h.Score, BM25Rank: h.BM25Rank,
			VectorRank: h.VectorRank, DocID: h.DocID, ChunkID: h.ChunkID, Text: h.Text})
	}
	return res, nil
}

// ListKnowledge implements ipc.Knowledge.
func (s *Service) ListKnowledge(ctx context.Context, p protocol.KnowledgeListParams) (protocol.KnowledgeListResult, error) {
	var sc knowledge.Scope
	if p.Scope != "" {
		var err error
		if sc, err = scope("scope", p.Scope); err != nil {
			return protocol.KnowledgeListResult{}, err
		}
	}
	res := protocol.KnowledgeListResult{Scopes: []protocol.KnowledgeScope{}, Docs: []protocol.KnowledgeDoc{}, Watches: []protocol.KnowledgeWatch{}}
	infos, err := s.Index.Scopes(ctx)
	if err != nil {
		return res, err
	}
	for _, si := range infos {
		if sc != "" && si.Name != sc {
			continue
		}
		labels := si.Labels
		if labels == nil {
			labels = []string{}
		}
		res.Scopes = append(res.Scopes, protocol.KnowledgeScope{Name: string(si.Name), Labels: labels, Docs: si.Docs, Chunks: si.Chunks, Bytes: si.Bytes})
	}
	docs, err := s.Index.List(ctx, sc)
	if err != nil {
		return res, storeErr(err)
	}
	for _, d := range docs {
		res.Docs = append(res.Docs, docOut(d))
	}
	if s.Watcher != nil {
		for _, w := range s.Watcher.List() {
			if sc == "" || w.Scope == string(sc) {
				res.Watches = append(res.Watches, w)
			}
		}
	}
	return res, nil
}

// ForgetKnowledge implements ipc.Knowledge. Nothing to forget wraps
// keel.ErrNotFound.
func (s *Service) ForgetKnowledge(ctx context.Context, p protocol.KnowledgeForgetParams) (protocol.KnowledgeForgetResult, error) {
	sel := knowledge.ForgetSelector{Path: p.Path, ID: p.ID}
	if p.Scope != "" {
		sc, err := scope("scope", p.Scope)
		if err != nil {
			return protocol.KnowledgeForgetResult{}, err
		}
		sel.Scope = sc
	}
	n, err := s.Index.Forget(ctx, sel)
	if err != nil {
		return protocol.KnowledgeForgetResult{}, storeErr(err)
	}
	return protocol.KnowledgeForgetResult{Forgotten: n}, nil
}

// errNoWatcher: the daemon watches nothing.
var errNoWatcher = fmt.Errorf("this daemon does not watch directories: %w", keel.ErrUnavailable)

// WatchKnowledge implements ipc.Knowledge.
func (s *Service) WatchKnowledge(ctx context.Context, p protocol.KnowledgeWatchParams, by string) (protocol.KnowledgeWatch, error) {
	if s.Watcher == nil {
		return protocol.KnowledgeWatch{}, errNoWatcher
	}
	sc, err := scope("scope", p.Scope)
	if err != nil {
		return protocol.KnowledgeWatch{}, err
	}
	return s.Watcher.Watch(ctx, p.Dir, sc, p.Labels)
}

// UnwatchKnowledge implements ipc.Knowledge.
func (s *Service) UnwatchKnowledge(ctx context.Context, p protocol.KnowledgeUnwatchParams) error {
	if s.Watcher == nil {
		return errNoWatcher
	}
	return s.Watcher.Unwatch(p.Dir)
}

// LabelScope implements ipc.Knowledge.
func (s *Service) LabelScope(ctx context.Context, p protocol.KnowledgeLabelsParams) (protocol.KnowledgeScope, error) {
	sc, err := scope("scope", p.Scope)
	if err != nil {
		return protocol.KnowledgeScope{}, err
	}
	if err := s.Index.SetScopeLabels(ctx, sc, p.Labels); err != nil {
		return protocol.KnowledgeScope{}, storeErr(err)
	}
	out := protocol.KnowledgeScope{Name: string(sc), Labels: p.Labels}
	infos, err := s.Index.Scopes(ctx)
	if err == nil {
		for _, si := range infos {
			if si.Name == sc {
				out.Docs, out.Chunks, out.Bytes = si.Docs, si.Chunks, si.Bytes
			}
		}
	}
	return out, nil
}
