package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/telemetry"
)

// TelemetryConfigFile is the export configuration in the data directory
// (docs/observability.md); optional: without it nothing is exported.
const TelemetryConfigFile = telemetry.ConfigFile

// engineStore is the store as the engine sees it: its journal and its
// trace, both through the exporter (the journal so that the export
// takes the runs' records as they are written instead of reading them).
type engineStore struct {
	engine.Journal
	engine.Tracer
}

// openTelemetry reads telemetry.json and makes the exporter. A run's
// spans are exported only if its policy (eng's, once made) allows the
// telemetry action to the collector; a joined edge exports the run of a
// step handed to it in the trace its offer carried. A file that does not load fails the
// start with its file and field.
func openTelemetry(cfg Config, st *store.Store, eng *atomic.Pointer[engine.Engine], log *slog.Logger) (*telemetry.Exporter, error) {
	tc, err := telemetry.LoadConfig(filepath.Join(cfg.DataDir, TelemetryConfigFile))
	if err != nil {
		return nil, err
	}
	opts := telemetry.Options{Config: tc, Runs: st, Version: Version, Logger: log,
		Policy: func(run keel.Run) *policy.Policy {
			if e := eng.Load(); e != nil {
				p, _ := e.PolicyOf(run)
				return p
			}
			return nil
		}}
	if cfg.Join != "" {
		// The run of a step another edge handed this one is exported in
		// that edge's trace, under its hand-off span, as its offer said.
		opts.TraceParent = func(ctx context.Context, run keel.RunID) string {
			o, err := st.StepOfferOf(ctx, run)
			if err != nil {
				return ""
			}
			return o.TraceParent
		}
	}
	x, err := telemetry.New(opts)
	if err != nil {
		return nil, err
	}
	if tc.Enabled() {
		s := x.Stats()
		log.Info("exporting traces", logkey.Endpoint, s.Endpoint, logkey.Protocol, s.Protocol, logkey.Content, s.Content)
	}
	return x, nil
}

// telemetryState declares the export's state for env.describe (keel doctor).
func telemetryState(x *telemetry.Exporter) *capabilities.TelemetryState {
	s := x.Stats()
	st := &capabilities.TelemetryState{Export: s.Enabled, Endpoint: s.Endpoint, Protocol: s.Protocol, File: s.File, Content: s.Content, Metrics: s.Metrics,
		Exported: s.Exported, Dropped: s.Dropped, Failed: s.Failed, Denied: s.Denied, Queued: s.Queued, QueueSize: s.QueueSize, LastError: s.LastError}
	if !s.LastErrorAt.IsZero() {
		st.LastErrorAt = s.LastErrorAt.UTC()
	}
	if !s.LastExport.IsZero() {
		st.LastExport = s.LastExport.UTC()
	}
	return st
}
