package ipc

import (
	"encoding/json"

	"github.com/keel-runtime/keel"
)

// mergeDelta folds the model.delta ev into the newest queued event of
// its run, when that is a delta of the same step, and reports whether
// it did. A fast local model streams deltas faster than a busy
// connection writes them; folding them keeps every byte of the text in
// order without holding more frames, where a full queue would otherwise
// drop the client. A delta that restarts the text, or one whose run's
// newest queued event is not a delta of its step, is not folded.
// maxMergedDelta bounds the text one folded delta may hold: a client
// that stays behind by more is dropped, as for any other overflow.
const maxMergedDelta = 1 << 20

func mergeDelta(items []outMsg, ev keel.Event) bool {
	if ev.Type != keel.EventModelDelta || ev.Seq != 0 {
		return false
	}
	var next keel.ModelDeltaData
	if json.Unmarshal(ev.Data, &next) != nil || next.Restart {
		return false
	}
	for i := len(items) - 1; i >= 0; i-- {
		it := &items[i]
		if !it.isEv || it.ev.RunID != ev.RunID {
			continue
		}
		if it.ev.Type != keel.EventModelDelta {
			return false
		}
		var prev keel.ModelDeltaData
		if json.Unmarshal(it.ev.Data, &prev) != nil || prev.Step != next.Step || len(prev.Content)+len(next.Content) > maxMergedDelta {
			return false
		}
		prev.Content += next.Content
		raw, err := json.Marshal(prev)
		if err != nil {
			return false
		}
		it.ev.Data = raw
		return true
	}
	return false
}

// compactDeltas folds each queued live model.delta into the queued
// delta of its run and step just before it (with no other event of that
// run between), returning the shorter queue and its live count. It makes
// room for the events that follow a flood of deltas, such as the
// model.result that ends them.
func compactDeltas(items []outMsg, live int) ([]outMsg, int) {
	out := items[:0]
	lastOfRun := map[keel.RunID]int{} // index in out of each run's newest event
	for _, it := range items {
		if it.isEv && it.live {
			if i, ok := lastOfRun[it.ev.RunID]; ok && out[i].live && mergeDelta(out[i:i+1], it.ev) {
				live--
				continue
			}
		}
		out = append(out, it)
		if it.isEv {
			lastOfRun[it.ev.RunID] = len(out) - 1
		}
	}
	clear(items[len(out):]) // drop references the shorter slice no longer holds
	return out, live
}
