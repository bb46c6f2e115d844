package daemon

import (
	"context"
	"path/filepath"
	"time"

	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/internal/logkey"
)

// joinCloud joins the cloud at cfg.Join as an edge (cloud/edge): its
// declaration is env.describe, its runs' events go to the outbox, the
// steps the cloud hands it start runs of eng, and at start the outbox
// is given what it misses of the journal (l.services.History). The
// edge's leaf server keeps its store in DATA_DIR/edge; the plan steps the
// engine cannot run here go to other edges through l.placer
// (edge.Placer), and the steps' runs' spans go back to their origins. It
// returns the edge's close.
func (d *Daemon) joinCloud(ctx context.Context, l *layers) (func(), error) {
	env, eng, slot := l.env, l.eng, l.placer
	cfg := d.cfg
	e, err := edge.Join(ctx, edge.Config{URL: cfg.Join, Credentials: cfg.JoinCredentials, Name: cfg.EdgeName,
		Dir: filepath.Join(cfg.DataDir, "edge"), Heartbeat: cfg.EdgeHeartbeat, AllowLabels: cfg.EdgeAllowLabels,
		Logger: d.log.With(logkey.Component, "edge")},
		edge.Sources{Describe: env.Describe, Labels: eng.ContextLabels, Start: eng.Start, Spans: l.spans, Journal: l.services.History,
			Cancel: eng.Cancel, Offers: l.offers})
	if err != nil {
		return func() {}, err
	}
	placer := edge.NewPlacer(e)
	slot.p.Store(placer)
	unsubscribe := eng.Subscribe(e.OnEvent)
	return func() {
		unsubscribe()
		placer.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Close(ctx)
	}, nil
}
