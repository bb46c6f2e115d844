package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/keel-runtime/keel"
)

// Take over and hand back: a person takes control of a run, which stops
// advancing (it pauses at its next step boundary, or stays paused or
// waiting); while in control the person may say things, run tools on the
// run's behalf and decide what it waits on; handing it back lets it go on,
// and the model reads what the person did and said before its next step.

// TakeOver gives a person control of a running, paused or waiting run:
// human.takeover is journaled and a running run pauses at its next step
// boundary. note is kept with the event.
func (e *Engine) TakeOver(ctx context.Context, id keel.RunID, note string) (keel.Run, error) {
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	switch r.Status {
	case keel.RunRunning, keel.RunPaused, keel.RunWaiting:
	default:
		return r, fmt.Errorf("run %s is %s; only a running, paused or waiting run can be taken over: %w", id, r.Status, keel.ErrConflict)
	}
	if over, err := e.takenOver(ctx, id); err != nil {
		return r, err
	} else if over {
		return r, fmt.Errorf("run %s is already taken over: %w", id, keel.ErrConflict)
	}
	if _, err := e.appendEvent(ctx, id, keel.EventTakeOver, keel.HumanControlData{Note: note}, nil); err != nil {
		return r, err
	}
	e.mu.Lock()
	if _, active := e.active[id]; active {
		e.pausing[id] = true
	}
	e.mu.Unlock()
	return e.cfg.Store.GetRun(ctx, id)
}

// HandBack returns control of a taken-over run: human.handback is
// journaled (note, when given, is a message the model reads) and a paused
// run goes on; a waiting run still waits for its decision.
func (e *Engine) HandBack(ctx context.Context, id keel.RunID, note string) (keel.Run, error) {
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	if over, err := e.takenOver(ctx, id); err != nil {
		return r, err
	} else if !over {
		return r, fmt.Errorf("run %s is not taken over: %w", id, keel.ErrConflict)
	}
	ev, err := e.appendEvent(ctx, id, keel.EventHandBack, keel.HumanControlData{Note: note}, nil)
	if err != nil {
		return r, err
	}
	e.mu.Lock()
	delete(e.pausing, id) // asked by TakeOver, not reached yet
	if _, active := e.active[id]; active && note != "" {
		// The loop never stopped: it reads the note from its inbox.
		e.inbox[id] = append(e.inbox[id], inboxMsg{seq: ev.Seq, text: handBackText(note)})
	}
	e.mu.Unlock()
	if r.Status == keel.RunPaused {
		if err := e.launch(r); err != nil && !errors.Is(err, keel.ErrConflict) {
			return r, err
		}
	}
	return e.cfg.Store.GetRun(ctx, id)
}

// RunTool runs a tool on behalf of a taken-over run that is not
// advancing (paused or waiting): the person's own call, journaled as
// human.tool with its outcome. Only the tools the run may use are
// allowed; a tool's failure is an outcome, not an error.
func (e *Engine) RunTool(ctx context.Context, id keel.RunID, name string, args json.RawMessage) (keel.HumanToolData, error) {
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.HumanToolData{}, err
	}
	over, step, err := e.control(ctx, id)
	if err != nil {
		return keel.HumanToolData{}, err
	} else if !over {
		return keel.HumanToolData{}, fmt.Errorf("run %s is not taken over; take it over before running tools for it: %w", id, keel.ErrConflict)
	}
	if r.KindOrAgent() != keel.KindAgent {
		return keel.HumanToolData{}, fmt.Errorf("run %s is a %s run, whose steps are its sub-agents: run tools for the sub-agent of the step: %w", id, r.KindOrAgent(), keel.ErrInvalid)
	}
	if r.Status != keel.RunPaused && r.Status != keel.RunWaiting {
		return keel.HumanToolData{}, fmt.Errorf("run %s is %s; wait until it pauses: %w", id, r.Status, keel.ErrConflict)
	}
	if !slices.ContainsFunc(e.toolsFor(ctx, r, e.cfg.Tools.Specs(ctx)), func(s keel.ToolSpec) bool { return s.Name == name }) {
		return keel.HumanToolData{}, fmt.Errorf("no tool %s among the tools run %s may use: %w", name, id, keel.ErrInvalid)
	}
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	call := keel.ToolCall{ID: "human_" + e.cfg.NewID(), Name: name, Arguments: args}
	d := keel.HumanToolData{Call: call, Private: e.readsPrivate(name)}
	// A person makes the call: its egress needs no one else's approval,
	// but what the policy denies stays denied.
	touched, egress := &keel.Touched{}, &egressLog{}
	out, err := e.cfg.Tools.Call(ctx, keel.ToolInvocation{Run: id, Step: max(step, 1), CallID: call.ID, Name: name, Args: args,
		Touched: touched, Egress: e.egressCheck(r, call, true, egress), LabelsOf: e.labelsOf(r, call, d.Private)})
	d.Labels = e.resultLabels(r, call, touched, d.Private)
	if err != nil {
		var te *keel.ToolError
		if !errors.As(err, &te) {
			te = &keel.ToolError{Code: keel.ToolCrashed, Message: err.Error()}
		}
		d.Error = te
	} else {
		d.Output = out
	}
	if _, err := e.appendEvent(ctx, id, keel.EventHumanTool, d, nil); err != nil {
		return d, err
	}
	return d, nil
}

// takenOver reports whether the run's journal has a take over not yet
// handed back.
func (e *Engine) takenOver(ctx context.Context, id keel.RunID) (bool, error) {
	over, _, err := e.control(ctx, id)
	return over, err
}

// control reads from the run's journal whether it is taken over and its
// last model step.
func (e *Engine) control(ctx context.Context, id keel.RunID) (over bool, step int, err error) {
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		return false, 0, err
	}
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventTakeOver:
			over = true
		case keel.EventHandBack:
			over = false
		case keel.EventModelResult:
			var d keel.ModelResultData
			if json.Unmarshal(ev.Data, &d) == nil {
				step = d.Step
			}
		}
	}
	return over, step, nil
}

// humanToolText is what the model reads about a person's tool call.
func humanToolText(d keel.HumanToolData) string {
	if d.Error != nil {
		return fmt.Sprintf("While in control of this run I called tool %s with %s myself; it failed: %s", d.Call.Name, d.Call.Arguments, d.Error.Error())
	}
	return fmt.Sprintf("While in control of this run I called tool %s with %s myself; it returned %s", d.Call.Name, d.Call.Arguments, d.Output)
}

// handBackText is what the model reads of a hand back's note.
func handBackText(note string) string { return "I am handing the run back to you: " + note }
