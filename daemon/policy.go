package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/policy"
)

// openPolicy loads the policy files (the managed layer's, Config.
// ManagedPolicyFile, and the user layer's, policy.json in the data
// directory) and watches them, with the workspace files of the runs in
// flight (the engine Uses them): an edit applies from the next decision;
// a file that stops loading keeps the last good policy in force and is
// logged with its file and line. changed, when set, is told of every
// reload (to journal it in the runs it concerns). A missing file is no
// file. Files that do not load at start fail it: there is no last good
// policy to keep.
func openPolicy(cfg Config, log *slog.Logger, changed func(policy.Event)) (*policy.Watcher, error) {
	home, _ := os.UserHomeDir()
	w, err := policy.NewWatcher(policy.WatcherConfig{
		Paths:   policy.Paths{Managed: cfg.ManagedPolicyFile, User: policy.UserPath(cfg.DataDir)},
		Options: policy.DefaultOptions(home),
		OnEvent: func(ev policy.Event) {
			if ev.Err != nil {
				log.Error("the policy files do not load; the last good policy stays in force", logkey.Workspace, ev.Workspace, logkey.Version, ev.Version, logkey.Err, ev.Err)
			} else {
				log.Info("policy reloaded", logkey.Workspace, ev.Workspace, logkey.Version, ev.Version, logkey.Digest, ev.Policy.Digest())
			}
			if changed != nil {
				changed(ev)
			}
			if cfg.OnPolicy != nil {
				cfg.OnPolicy(ev)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	for _, warn := range w.Current().Policy.Warnings() {
		log.Warn("policy", logkey.Warning, warn.String())
	}
	return w, nil
}

// policyState declares the policy in force for env.describe: the
// watcher's, and each workspace's a live run names.
func policyState(w *policy.Watcher) *capabilities.PolicyState {
	snap := w.Current()
	st := &capabilities.PolicyState{Version: snap.Version, Digest: snap.Policy.Digest(), Files: []string{}}
	roots := w.InUse()
	slices.Sort(roots)
	for _, root := range roots {
		ws := w.CurrentFor(root)
		wst := capabilities.WorkspacePolicyState{Root: root, Version: ws.Version, Digest: ws.Policy.Digest()}
		if ws.Err != nil {
			wst.Error = ws.Err.Error()
		}
		st.Workspaces = append(st.Workspaces, wst)
	}
	for _, f := range snap.Policy.Files() {
		st.Files = append(st.Files, f.Layer.String()+" "+f.Name)
	}
	if snap.Err != nil {
		st.Error = snap.Err.Error()
	}
	return st
}
