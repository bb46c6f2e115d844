package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/recall"
	"github.com/keel-runtime/keel/store"
)

// knowledgeLayer is the knowledge store with what puts it to use
// (package recall): the knowledge_search tool, the watch, the service of
// the knowledge.* methods.
type knowledgeLayer struct {
	index   *knowledge.Index
	tool    *recall.Tool
	watcher *recall.Watcher
	service *recall.Service
}

// openKnowledge opens the knowledge store in the daemon's database file
// and makes its tool (its calls audited like any tool's, its retrieval
// spans in tracer, its runs' policy eng's once made) and its watch
// (knowledge-watch.json in the data directory).
func openKnowledge(ctx context.Context, cfg Config, st *store.Store, local models.Provider, tracer engine.Tracer, audit intercept.Tool, eng *atomic.Pointer[engine.Engine], log *slog.Logger) (*knowledgeLayer, error) {
	o := knowledge.Options{Logger: log}
	if cfg.EmbedModel != "" {
		em, ok := local.(models.Embedder)
		if !ok {
			return nil, fmt.Errorf("--embed-model %s: the local provider %s serves no embeddings", cfg.EmbedModel, local.Name())
		}
		o.Embedder, o.EmbedModel, o.ModelDigest = em, cfg.EmbedModel, digestOf(local)
	}
	ix, err := knowledge.Open(ctx, filepath.Join(cfg.DataDir, "keel.db"), o)
	if err != nil {
		return nil, fmt.Errorf("open the knowledge store: %w", err)
	}
	tool, err := recall.NewTool(recall.Config{Index: ix, Runs: st.GetRun, Tracer: tracer, Interceptors: intercept.Tools{audit}, Logger: log,
		Policy: func(run keel.Run) (*policy.Policy, uint64) {
			if e := eng.Load(); e != nil {
				return e.PolicyOf(run)
			}
			return nil, 0
		}})
	if err != nil {
		ix.Close()
		return nil, err
	}
	w, err := recall.NewWatcher(recall.WatcherConfig{Index: ix, File: filepath.Join(cfg.DataDir, recall.WatchFile), Logger: log})
	if err != nil {
		ix.Close()
		return nil, err
	}
	svc := &recall.Service{Index: ix, Watcher: w, Runs: st.GetRun, ContextLabels: func(ctx context.Context, id keel.RunID) ([]string, error) {
		if e := eng.Load(); e != nil {
			return e.ContextLabels(ctx, id)
		}
		return nil, fmt.Errorf("the engine is not ready: %w", keel.ErrUnavailable)
	}}
	return &knowledgeLayer{index: ix, tool: tool, watcher: w, service: svc}, nil
}

// close closes the store; the watch has ended (Serve runs it).
func (k *knowledgeLayer) close(log *slog.Logger) {
	if err := k.index.Close(); err != nil {
		log.Warn("close the knowledge store", logkey.Err, err)
	}
}

// digestOf returns the digest of a model of p: the provider's own
// (Ollama's Digest, cached), or as its model list reports it ("" when it
// does not list the model).
func digestOf(p models.Provider) func(ctx context.Context, model string) (string, error) {
	if d, ok := p.(interface {
		Digest(ctx context.Context, model string) (string, error)
	}); ok {
		return d.Digest
	}
	return func(ctx context.Context, model string) (string, error) {
		list, err := p.Models(ctx)
		if err != nil {
			return "", err
		}
		for _, m := range list {
			if m.Name == model || strings.TrimSuffix(m.Name, ":latest") == model {
				return m.Digest, nil
			}
		}
		return "", nil
	}
}
