package edge

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/keel-runtime/keel"
)

func ev(run string, seq int64, typ keel.EventType, data string) keel.Event {
	return keel.Event{RunID: keel.RunID(run), Seq: seq, Type: typ, Data: json.RawMessage(data)}
}

// TestFilter: events cross until the first whose labels may not; from it
// on, the run's events cross as stubs, keeping the status of its end.
func TestFilter(t *testing.T) {
	t.Parallel()
	labels := map[keel.RunID][]string{"r-private": {"private"}, "r-pii": {"pii"}}
	f := NewFilter([]string{"pii", "private"}, func(_ context.Context, id keel.RunID) ([]string, error) {
		if id == "r-gone" {
			return nil, errors.New("no such run")
		}
		return labels[id], nil
	})
	tests := []struct {
		in    keel.Event
		cross bool
	}{
		{ev("r1", 1, keel.EventRunStarted, `{"goal":"g"}`), true},
		{ev("r1", 2, keel.EventToolResult, `{"output":"x","labels":["pii"]}`), true},
		{ev("r1", 3, keel.EventToolResult, `{"output":"secret","private":true}`), false},
		{ev("r1", 4, keel.EventModelResult, `{"content":"the secret is"}`), false}, // held from here on
		{ev("r1", 5, keel.EventContextSummary, `{"summary":"secret"}`), false},
		{ev("r1", 6, keel.EventRunSucceeded, `{"status":"succeeded","result":"secret"}`), false},
		{ev("r2", 1, keel.EventRunStarted, `{"goal":"g"}`), true},
		{ev("r2", 2, keel.EventModelResult, `{"content":"s","labels":["secret"]}`), false},
		{ev("r-private", 1, keel.EventRunStarted, `{"goal":"mine"}`), false}, // a private run from its start
		{ev("r-pii", 1, keel.EventRunStarted, `{"goal":"allowed"}`), true},
		{ev("r-gone", 3, keel.EventModelResult, `{"content":"?"}`), false}, // unknown labels: held
		{ev("r3", 1, keel.EventRunStarted, `not json`), false},
	}
	for _, tc := range tests {
		out, crossed := f.Pass(context.Background(), tc.in)
		if crossed != tc.cross {
			t.Errorf("Pass(%s %d %s) crossed = %v, want %v", tc.in.RunID, tc.in.Seq, tc.in.Data, crossed, tc.cross)
			continue
		}
		if out.Seq != tc.in.Seq || out.Type != tc.in.Type || out.RunID != tc.in.RunID {
			t.Errorf("Pass(%v) = %v, want the same run, seq and type", tc.in, out)
		}
		if crossed && string(out.Data) != string(tc.in.Data) {
			t.Errorf("Pass(%v) data = %s, want it unchanged", tc.in, out.Data)
		}
		if !crossed {
			want := `{"withheld":true}`
			if tc.in.Type == keel.EventRunSucceeded {
				want = `{"withheld":true,"status":"succeeded"}`
			}
			if string(out.Data) != want {
				t.Errorf("Pass(%v) data = %s, want %s", tc.in, out.Data, want)
			}
		}
	}
}

// TestFilterPrivateNeverAllowed: allowing "private" does not let it
// cross.
func TestFilterPrivateNeverAllowed(t *testing.T) {
	t.Parallel()
	f := NewFilter([]string{"private"}, nil)
	if _, crossed := f.Pass(context.Background(), ev("r", 1, keel.EventToolResult, `{"labels":["private"]}`)); crossed {
		t.Error("an event labelled private crossed with private allowed")
	}
}
