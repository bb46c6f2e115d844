package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go"
)

// A step's origin cancels the step's run on the edge that runs it:
// request/reply on the edge's cancel subject, as a step is offered. The
// edge cancels only a run of a step it accepted from that origin
// (kept with its runs: Offers), and asking again is harmless: a run that
// ended already answers how it ended.

// CancelSubject is where edge answers for cancelling a run of a step
// handed to it (request/reply, CancelRequest → CancelReply).
func CancelSubject(ns, edge string) string { return ns + ".edge." + edge + ".cancel" }

// CancelRequest asks an edge to cancel the run of a step handed to it:
// by its run, or, when the origin does not know it (its offer's answer
// has not come), by the step's key.
type CancelRequest struct {
	Run keel.RunID `json:"run,omitempty"`
	// Key is the step's ID (Step.ID), when Run is not set: the edge
	// cancels the run of that step if it has one, and starts none for it
	// from then on (an offer still on its way is refused).
	Key string `json:"key,omitempty"`
	// Origin is the edge that handed the step off, which alone may
	// cancel its run.
	Origin string `json:"origin"`
}

// CancelReply is an edge's answer to a CancelRequest: the run's status
// (cancelled, or how it had ended already), or why it refused.
type CancelReply struct {
	Status keel.RunStatus `json:"status,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// serveCancel answers a CancelRequest from the origin of one of the
// edge's steps.
func (e *Edge) serveCancel(m *nats.Msg) {
	reply := func(r CancelReply) {
		b, _ := json.Marshal(r)
		m.Respond(b)
	}
	var req CancelRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		reply(CancelReply{Error: "not a cancel request"})
		return
	}
	if asker, ok := askerOf(m, CancelSubject(e.cfg.Namespace, e.cfg.Name)); ok {
		req.Origin = asker // an edge cancels as itself
	}
	if req.Run == "" && req.Key == "" || req.Origin == "" {
		reply(CancelReply{Error: "not a cancel request"})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if req.Run == "" {
		e.offerMu.Lock()
		off, err := e.src.Offers.CancelStepOffer(ctx, "step-"+req.Key, req.Origin)
		e.offerMu.Unlock()
		switch {
		case err != nil:
			e.log.Warn("edge: cancel a step's offer", logkey.Step, req.Key, logkey.Err, err)
			reply(CancelReply{Error: "the step's cancel could not be kept"})
			return
		case off.Origin != req.Origin:
			reply(CancelReply{Error: fmt.Sprintf("step %s was not handed to %s by %s", req.Key, e.cfg.Name, req.Origin)})
			return
		case off.Run == "":
			reply(CancelReply{Status: keel.RunCancelled}) // none starts
			return
		}
		req.Run = off.Run
	} else {
		off, err := e.src.Offers.StepOfferOf(ctx, req.Run)
		if err != nil && !errors.Is(err, keel.ErrNotFound) {
			e.log.Warn("edge: read a step's offer", logkey.Run, req.Run, logkey.Err, err)
			reply(CancelReply{Error: "the step's offer could not be read"})
			return
		}
		if err != nil || off.Origin != req.Origin {
			reply(CancelReply{Error: fmt.Sprintf("run %s is not a step %s handed to %s", req.Run, req.Origin, e.cfg.Name)})
			return
		}
	}
	r, err := e.src.Cancel(ctx, req.Run)
	switch {
	case errors.Is(err, keel.ErrConflict) && r.Status.Terminal():
		reply(CancelReply{Status: r.Status}) // it had ended already
	case err != nil:
		reply(CancelReply{Error: err.Error()})
	case r.Status.Terminal():
		reply(CancelReply{Status: r.Status})
	default:
		reply(CancelReply{Status: keel.RunCancelled}) // stopping now
	}
}

// RemoteCancel asks edge to cancel a run of a step req.Origin handed to
// it, and returns the run's status there (cancelled, for a step with no
// run there: none will start).
func RemoteCancel(ctx context.Context, nc *nats.Conn, ns, edge string, req CancelRequest) (keel.RunStatus, error) {
	what := string(req.Run)
	if what == "" {
		what = "step " + req.Key
	}
	b, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	m, err := nc.RequestWithContext(ctx, AskSubject(CancelSubject(ns, edge), req.Origin), b)
	if err != nil {
		return "", fmt.Errorf("cancel %s on %s: %w", what, edge, err)
	}
	var r CancelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return "", fmt.Errorf("cancel %s on %s: %w", what, edge, err)
	}
	if r.Error != "" {
		return "", fmt.Errorf("cancel %s on %s: %w: %s", what, edge, ErrRefused, r.Error)
	}
	return r.Status, nil
}

// Cancel asks env to cancel the step this edge handed to it under key:
// its run there, run, or, when run is "", the run of key if there is
// one, and any offer of key still on its way (RemoteCancel).
func (p *Placer) Cancel(ctx context.Context, env string, key, run keel.RunID) (keel.RunStatus, error) {
	req := CancelRequest{Run: run, Origin: p.e.cfg.Name}
	if run == "" {
		req.Key = string(key)
	}
	return RemoteCancel(ctx, p.e.nc, p.e.cfg.Namespace, env, req)
}
