package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// Labels that follow data through a run. A run's context holds the union
// of the labels of everything that entered it, less what a person
// declassified (policy.Context does the arithmetic):
//
//   - its inputs: keel.RunPolicy.Labels (Start adds the policy's input
//     sources), and private for a run started private;
//   - each tool result (keel.ToolResultData.Labels: what the tool host
//     says the call touched, the policy's sources for the paths it opened
//     and for the tool, private for a tool with a private grant), a
//     person's messages and tool calls, and a sub-agent's labels on its
//     step.finished;
//   - minus each labels.declassified.
//
// Every label-bearing event journals the labels it brings, so the
// journal alone says what the context holds: foldLabels reads it, on
// resume and in a replay, and a live run tracks the same fold event by
// event (see labelTracker), applying each delta under a per-run lock in
// the order the journal numbers the events.

// labelDelta is what one journaled event does to a run's context labels:
// labels it brings, or a label a person cleared.
type labelDelta struct {
	add   []string
	clear *keel.DeclassifyData
}

// withPrivate adds private to ls when private is set.
func withPrivate(ls []string, private bool) []string {
	if private && !slices.Contains(ls, string(policy.Private)) {
		return append(slices.Clip(ls), string(policy.Private))
	}
	return ls
}

// eventLabels returns what an event of type typ with payload data (the
// typed payload, as appended) does to the context's labels, and whether
// it does anything.
func eventLabels(typ keel.EventType, data any) (labelDelta, bool) {
	var d labelDelta
	switch v := data.(type) {
	case keel.ToolResultData:
		d.add = withPrivate(v.Labels, v.Private)
	case *keel.ToolResultData:
		d.add = withPrivate(v.Labels, v.Private)
	case keel.HumanMessageData:
		d.add = v.Labels
	case keel.HumanToolData:
		d.add = withPrivate(v.Labels, v.Private)
	case keel.StepData:
		if typ == keel.EventStepFinished {
			d.add = withPrivate(v.Labels, v.Private)
		}
	case keel.DeclassifyData:
		return labelDelta{clear: &v}, true
	}
	return d, len(d.add) > 0
}

// decodeLabels is eventLabels of a journaled event.
func decodeLabels(ev keel.Event) (labelDelta, error) {
	var data any
	var err error
	switch ev.Type {
	case keel.EventToolResult:
		data, err = decodeAs[keel.ToolResultData](ev.Data)
	case keel.EventHumanMessage:
		data, err = decodeAs[keel.HumanMessageData](ev.Data)
	case keel.EventHumanTool:
		data, err = decodeAs[keel.HumanToolData](ev.Data)
	case keel.EventStepFinished:
		data, err = decodeAs[keel.StepData](ev.Data)
	case keel.EventDeclassified:
		data, err = decodeAs[keel.DeclassifyData](ev.Data)
	default:
		return labelDelta{}, nil
	}
	if err != nil {
		return labelDelta{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
	}
	d, _ := eventLabels(ev.Type, data)
	return d, nil
}

// apply returns c after the event d stands for.
func (d labelDelta) apply(c policy.Context) policy.Context {
	if d.clear != nil {
		// Journaled only once checked; a malformed one changes nothing.
		c, _ = c.Declassify(policy.Declassification{Label: policy.Label(d.clear.Label), By: d.clear.By, Reason: d.clear.Reason})
		return c
	}
	return c.Add(labelSet(d.add))
}

// inputLabels are the labels a run's inputs bring: its policy's Labels,
// and private for a run started private.
func inputLabels(run keel.Run) policy.LabelSet {
	return labelSet(withPrivate(run.Policy.Labels, run.Policy.Private))
}

// foldLabels is what the context of run holds after evs, its journal
// (or its start).
func foldLabels(run keel.Run, evs []keel.Event) (policy.Context, error) {
	c := policy.Context{}.Add(inputLabels(run))
	for _, ev := range evs {
		d, err := decodeLabels(ev)
		if err != nil {
			return c, err
		}
		c = d.apply(c)
	}
	return c, nil
}

// labelSet converts label names to a set.
func labelSet(names []string) policy.LabelSet {
	switch len(names) {
	case 0:
		return policy.LabelSet{}
	case 1:
		return policy.Labels(policy.Label(names[0]))
	}
	ls := make([]policy.Label, len(names))
	for i, n := range names {
		ls[i] = policy.Label(n)
	}
	return policy.Labels(ls...)
}

// labelNames converts a set to sorted label names; nil for none.
func labelNames(s policy.LabelSet) []string {
	if s.Len() == 0 {
		return nil
	}
	out := make([]string, 0, s.Len())
	for _, l := range s.Slice() {
		out = append(out, string(l))
	}
	return out
}

// unionNames is the sorted union of label name lists; nil for none.
func unionNames(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkLabels checks that every name is a well-formed label.
func checkLabels(names []string) error {
	for _, n := range names {
		if _, err := policy.ParseLabel(n); err != nil {
			return fmt.Errorf("%w: %w", err, keel.ErrInvalid)
		}
	}
	return nil
}

// labelTracker holds the context labels of the runs whose loops are
// live, each updated as its label-bearing events are journaled.
type labelTracker struct {
	mu   sync.Mutex // guards runs; held across a run's append when it is not live
	runs map[keel.RunID]*liveLabels
}

// liveLabels is one live run's context labels.
type liveLabels struct {
	mu   sync.Mutex // held across each label-bearing append of the run
	ctx  policy.Context
	refs int
}

// ref takes a reference on run id's live labels, creating them (first)
// locked, with l.mu held, when the run has none; the caller fills a new
// entry's context and unlocks it. release drops the reference.
func (t *labelTracker) ref(id keel.RunID) (l *liveLabels, first bool, release func()) {
	t.mu.Lock()
	if t.runs == nil {
		t.runs = map[keel.RunID]*liveLabels{}
	}
	l = t.runs[id]
	first = l == nil
	if first {
		l = &liveLabels{}
		t.runs[id] = l
	}
	l.refs++
	l.mu.Lock()
	t.mu.Unlock()
	if !first {
		l.mu.Unlock()
	}
	return l, first, func() {
		t.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(t.runs, id)
		}
		t.mu.Unlock()
	}
}

// trackFresh makes the labels of a run Start is about to create live
// before the run exists, so that nothing can be journaled to it
// untracked: its context holds only its inputs' labels, and there is no
// journal to read back. The returned func stops tracking; the run's loop
// takes it over (created.untrack).
func (e *Engine) trackFresh(run keel.Run) func() {
	l, first, release := e.labels.ref(run.ID)
	if first {
		l.ctx = policy.Context{}.Add(inputLabels(run))
		l.mu.Unlock()
	}
	return release
}

// trackLabels makes run's context labels live for its loop: folded from
// the journal now, then updated with every label-bearing event the
// engine journals. The returned func stops tracking.
func (e *Engine) trackLabels(ctx context.Context, run keel.Run) (func(), error) {
	l, first, release := e.labels.ref(run.ID)
	var err error
	if first {
		var evs []keel.Event
		if evs, err = e.cfg.Store.Events(ctx, run.ID, 0); err == nil {
			l.ctx, err = foldLabels(run, evs)
		}
		l.mu.Unlock()
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("read the run's labels: %w", err)
	}
	return release, nil
}

// lockLabels locks run id's labels for an append that changes them and
// returns its live labels (nil when its loop is not live: then every
// such append of the run waits) and the unlock.
func (e *Engine) lockLabels(id keel.RunID) (*liveLabels, func()) {
	t := &e.labels
	t.mu.Lock()
	l := t.runs[id]
	if l == nil {
		return nil, t.mu.Unlock
	}
	l.mu.Lock()
	t.mu.Unlock()
	return l, l.mu.Unlock
}

// contextLabels is what run id's context holds now: its live labels, or
// the fold of its journal.
func (e *Engine) contextLabels(ctx context.Context, run keel.Run) (policy.LabelSet, error) {
	t := &e.labels
	t.mu.Lock()
	l := t.runs[run.ID]
	if l != nil {
		l.mu.Lock()
		c := l.ctx
		l.mu.Unlock()
		t.mu.Unlock()
		return c.Labels(), nil
	}
	t.mu.Unlock()
	evs, err := e.cfg.Store.Events(ctx, run.ID, 0)
	if err != nil {
		return policy.LabelSet{}, err
	}
	c, err := foldLabels(run, evs)
	return c.Labels(), err
}

// ContextLabels returns the labels run id's context holds now, as its
// journal says: sorted names, empty for none. Errors wrap
// keel.ErrNotFound for an unknown run. Safe for concurrent use.
func (e *Engine) ContextLabels(ctx context.Context, id keel.RunID) ([]string, error) {
	run, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	c, err := foldLabels(run, evs)
	if err != nil {
		return nil, err
	}
	return append([]string{}, labelNames(c.Labels())...), nil
}

// Declassify clears a label from what a run's context holds now, for the
// reason a person gives: it journals labels.declassified, and the run's
// next model call and tool decision (a live run's too) see the cleared
// set. Data that enters later with the label brings it back.
//
// Errors wrap keel.ErrInvalid (no reason or no one named, a malformed
// label, or a label the context does not hold: the error names what it
// holds), keel.ErrNotFound (no such run) or keel.ErrConflict (the run
// has ended). Nothing is journaled on error.
func (e *Engine) Declassify(ctx context.Context, req keel.DeclassifyRequest) (keel.DeclassifyData, error) {
	d := keel.DeclassifyData{Label: req.Label, By: strings.TrimSpace(req.By), Reason: strings.TrimSpace(req.Reason)}
	switch {
	case d.Reason == "":
		return keel.DeclassifyData{}, fmt.Errorf("a declassification needs a reason: %w", keel.ErrInvalid)
	case d.By == "":
		return keel.DeclassifyData{}, fmt.Errorf("a declassification needs who decides: %w", keel.ErrInvalid)
	}
	if err := checkLabels([]string{d.Label}); err != nil {
		return keel.DeclassifyData{}, err
	}
	run, err := e.cfg.Store.GetRun(ctx, req.RunID)
	if err != nil {
		return keel.DeclassifyData{}, err
	}
	if run.Status.Terminal() {
		return keel.DeclassifyData{}, fmt.Errorf("run %s already %s: %w", run.ID, run.Status, keel.ErrConflict)
	}
	l, unlock := e.lockLabels(run.ID)
	var c policy.Context
	if l != nil {
		c = l.ctx
	} else {
		evs, err := e.cfg.Store.Events(ctx, run.ID, 0)
		if err == nil {
			c, err = foldLabels(run, evs)
		}
		if err != nil {
			unlock()
			return keel.DeclassifyData{}, err
		}
	}
	if !c.Labels().Has(policy.Label(d.Label)) {
		unlock()
		held := "no label"
		if c.Labels().Len() > 0 {
			held = strings.Join(labelNames(c.Labels()), ", ")
		}
		return keel.DeclassifyData{}, fmt.Errorf("run %s's context does not hold %s (it holds %s): %w", run.ID, d.Label, held, keel.ErrInvalid)
	}
	// Checked and journaled under the lock, so no result that brings the
	// label back can come between.
	after := labelDelta{clear: &d}.apply(c)
	d.Labels = labelNames(after.Labels())
	if _, err := e.appendThen(ctx, run.ID, keel.EventDeclassified, d, nil, func(err error) {
		if err == nil && l != nil {
			l.ctx = after
		}
		unlock()
	}); err != nil {
		return keel.DeclassifyData{}, err
	}
	return d, nil
}

// labelsNow is what run's context holds now (see contextLabels). When
// the journal cannot be read it fails closed: the run's inputs' labels
// and private, which keeps every model call local.
func (e *Engine) labelsNow(ctx context.Context, run keel.Run) policy.LabelSet {
	ls, err := e.contextLabels(ctx, run)
	if err != nil {
		e.log.Warn("read the run's labels; treating its context as private", logkey.Run, run.ID, logkey.Err, err)
		return inputLabels(run).Union(policy.Labels(policy.Private))
	}
	return ls
}

// scopeLabels returns msgs with each message's labels limited to held,
// what the context holds now: a label a person declassified leaves every
// message the context held then. msgs is copied only when a message
// changes.
func scopeLabels(msgs []models.Message, held policy.LabelSet) []models.Message {
	out := msgs
	for i, m := range msgs {
		stale := m.Private && !held.Has(policy.Private)
		for _, l := range m.Labels {
			stale = stale || !held.Has(policy.Label(l))
		}
		if !stale {
			continue
		}
		if &out[0] == &msgs[0] {
			out = slices.Clone(msgs)
		}
		out[i].Private = m.Private && held.Has(policy.Private)
		out[i].Labels = slices.DeleteFunc(slices.Clone(m.Labels), func(l string) bool { return !held.Has(policy.Label(l)) })
	}
	return out
}

// resultLabels are the labels of a tool call's output: those the tool
// host gives it (touched.Labels), the policy's sources for every path it
// opened (all of the policy's path sources when it opened more than it
// could list) and for the tool, and private for a tool with a private
// grant. A replay takes them from the journal.
func (e *Engine) resultLabels(run keel.Run, call keel.ToolCall, touched *keel.Touched, private bool) []string {
	if e.replay != nil {
		return e.replay.labels[call.ID]
	}
	p := e.labelPolicy(run)
	ls := labelSet(touched.Labels).Union(p.LabelsOf(policy.Source{Kind: policy.SourceTool, Name: call.Name}))
	for _, path := range touched.Paths {
		ls = ls.Union(p.LabelsOf(policy.Source{Kind: policy.SourcePath, Name: path}))
	}
	if touched.Truncated {
		ls = ls.Union(p.PathLabels())
	}
	if private {
		ls = ls.Union(policy.Labels(policy.Private))
	}
	return labelNames(ls)
}

// labelsOf is keel.ToolInvocation.LabelsOf for call of run: the labels
// resultLabels gives its output.
func (e *Engine) labelsOf(run keel.Run, call keel.ToolCall, private bool) func(*keel.Touched) []string {
	return func(t *keel.Touched) []string { return e.resultLabels(run, call, t, private) }
}

// touchedOrNil is t, or nil when the tool host recorded nothing.
func touchedOrNil(t *keel.Touched) *keel.Touched {
	if t == nil || len(t.Paths) == 0 && len(t.Hosts) == 0 && len(t.Labels) == 0 && !t.Truncated {
		return nil
	}
	return t
}

// NetworkRequester is implemented by Tools that can say whether a tool
// may reach the network (its manifest requests it). The engine asks it
// before every tool call: a call of such a tool after labelled data
// entered the run's context is also decided as egress (see decideTool).
// It must be safe for concurrent use. Tools that do not implement it
// are taken to reach no network; their requests still pass the call's
// egress check, if their host asks it (keel.ToolInvocation.Egress).
type NetworkRequester interface {
	RequestsNetwork(name string) bool
}

// requestsNetwork reports whether the tool name may reach the network.
func (e *Engine) requestsNetwork(name string) bool {
	nr, ok := e.cfg.Tools.(NetworkRequester)
	return ok && nr.RequestsNetwork(name)
}

// EgressRefusal is why the policy refused a tool's network request (see
// keel.EgressRefusal): its decision about the destination with the
// labels the run's context held.
type EgressRefusal = keel.EgressRefusal

// egressRecord is one egress decision of a call, on its span.
type egressRecord struct {
	Destination string               `json:"destination"`
	Policy      *keel.PolicyDecision `json:"policy"`
}

// egressLog collects a call's non-trivial egress decisions for its span.
type egressLog struct {
	mu  sync.Mutex
	log []egressRecord
}

func (l *egressLog) add(r egressRecord) {
	l.mu.Lock()
	l.log = append(l.log, r)
	l.mu.Unlock()
}

func (l *egressLog) records() []egressRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}

// egressCheck is the check the tool host asks before each network
// request of call (keel.ToolInvocation.Egress): the policy's egress
// decision about the destination, with the labels run's context holds
// at that moment. Allow lets the request go; ask lets it go only if a
// person approved this call (approved: it ran after asking, or a person
// made it);
// anything else refuses it with an *EgressRefusal. Decisions a rule or
// setting made are recorded in log, for the call's span. A replay makes
// no request.
func (e *Engine) egressCheck(run keel.Run, call keel.ToolCall, approved bool, log *egressLog) keel.EgressCheck {
	return func(ctx context.Context, dest string) error {
		if e.replay != nil {
			return nil
		}
		labels := e.labelsNow(ctx, run)
		p, version := e.policyFor(ctx, run)
		if p == nil {
			p = e.emptyPolicy
		}
		d := p.Decide(&policy.Action{Kind: policy.KindEgress, Tool: call.Name, Destination: dest, Labels: labels})
		if d.Rule() == nil && d.Setting() == nil && d.Outcome == policy.Allow {
			return nil
		}
		rec := &keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}
		log.add(egressRecord{Destination: dest, Policy: rec})
		if d.Outcome == policy.Allow || d.Outcome == policy.Ask && approved {
			return nil
		}
		return &EgressRefusal{Tool: call.Name, Destination: dest, Decision: *rec}
	}
}

// toolAttrs are a tool call span's attributes: the call's ID, the class
// of its error (te's code), the policy's decision that let it run, the
// labels of its result, its egress decisions. The call ID and the error
// class let an exporter (package telemetry) name the call and classify
// its failure without reading the journal or parsing the error text.
func toolAttrs(pd *keel.PolicyDecision, callID string, te *keel.ToolError, labels []string, egress []egressRecord) json.RawMessage {
	var code keel.ToolErrorCode
	if te != nil {
		code = te.Code
	}
	b, _ := json.Marshal(struct {
		CallID    string               `json:"call_id,omitempty"`
		ErrorType keel.ToolErrorCode   `json:"error_type,omitempty"`
		Policy    *keel.PolicyDecision `json:"policy,omitempty"`
		Labels    []string             `json:"labels,omitempty"`
		Egress    []egressRecord       `json:"egress,omitempty"`
	}{callID, code, pd, labels, egress})
	return b
}

// decodeAs decodes an event's data as a T, returned as the value
// eventLabels switches on.
func decodeAs[T any](b []byte) (any, error) {
	var d T
	err := json.Unmarshal(b, &d)
	return d, err
}
