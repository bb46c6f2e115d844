package edge

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/keel-runtime/keel"
)

// Withheld is the data of an event that did not cross: the cloud learns
// that the run has an event of this type at this sequence, and for the
// events that change a run's status, the status, nothing else.
type Withheld struct {
	Withheld bool           `json:"withheld"`
	Status   keel.RunStatus `json:"status,omitempty"`
}

// Filter decides what of a run's journal crosses to the cloud. Labels
// decide: an event crosses whole only if every label of its run's
// context so far (the run's inputs, what its tools read, what people
// said) and of the event itself is one the cloud may hold. From the first
// event that fails, the run is held: that event and every later one
// cross as a stub (Withheld), so nothing derived from the data, a model's
// answer, a summary, the run's result, leaves the edge either. A
// declassification does not release a held run (the filter is
// conservative; the run's journal on the edge has everything).
//
// A Filter is safe for concurrent use.
type Filter struct {
	allow map[string]bool
	// labels gives a run's context labels from its journal; used the
	// first time the filter sees a run (a run begun before the edge
	// joined, or before a restart).
	labels func(context.Context, keel.RunID) ([]string, error)

	mu   sync.Mutex
	held map[keel.RunID]bool
}

// NewFilter returns a filter letting events with labels in allow cross
// (never "private": a label private stays, whatever allow says). labels
// reads a run's context labels from its journal; nil treats a run first
// seen mid-way as held.
func NewFilter(allow []string, labels func(context.Context, keel.RunID) ([]string, error)) *Filter {
	f := &Filter{allow: map[string]bool{}, labels: labels, held: map[keel.RunID]bool{}}
	for _, l := range allow {
		if l != keel.LabelPrivate {
			f.allow[l] = true
		}
	}
	return f
}

// eventLabels is what any event's data says of labels.
type eventLabels struct {
	Labels  []string `json:"labels"`
	Private bool     `json:"private"`
}

// Pass returns ev as it may cross: itself, or a stub whose data is
// Withheld; crossed reports which.
func (f *Filter) Pass(ctx context.Context, ev keel.Event) (out keel.Event, crossed bool) {
	f.mu.Lock()
	held, seen := f.held[ev.RunID]
	f.mu.Unlock()
	if !seen {
		held = ev.Seq > 1 && f.labels == nil
		if f.labels != nil {
			ls, err := f.labels(ctx, ev.RunID)
			held = err != nil || !f.allowed(ls)
		}
	}
	if !held && len(ev.Data) > 0 {
		var el eventLabels
		if json.Unmarshal(ev.Data, &el) != nil || el.Private || !f.allowed(el.Labels) {
			held = true
		}
	}
	f.mu.Lock()
	if terminal(ev.Type) {
		delete(f.held, ev.RunID)
	} else {
		f.held[ev.RunID] = held
	}
	f.mu.Unlock()
	if !held {
		return ev, true
	}
	w := Withheld{Withheld: true}
	if statusOf(ev.Type) {
		var end keel.RunEndData
		if json.Unmarshal(ev.Data, &end) == nil {
			w.Status = end.Status
		}
	}
	ev.Data, _ = json.Marshal(w)
	return ev, false
}

func (f *Filter) allowed(ls []string) bool {
	for _, l := range ls {
		if !f.allow[l] {
			return false
		}
	}
	return true
}

// terminal reports whether an event of type t ends its run.
func terminal(t keel.EventType) bool {
	return t == keel.EventRunSucceeded || t == keel.EventRunFailed || t == keel.EventRunCancelled
}

// statusOf reports whether an event of type t carries a RunEndData whose
// status a stub keeps.
func statusOf(t keel.EventType) bool {
	return terminal(t) || t == keel.EventRunInterrupted || t == keel.EventRunPaused
}
