package wasmtools

import "time"

// onceTimer runs one function after a delay, armed at most once at a time
// and made only when first armed, so an idle daemon holds no timer that
// has nothing to do. It is not safe for concurrent use: its owner's lock
// guards it, and the function it runs takes that lock and calls fired
// first.
type onceTimer struct {
	t     *time.Timer
	armed bool
}

// arm starts the timer to run f after d, unless it is already armed. f
// must be the same on every call (a re-armed timer runs the first one).
func (o *onceTimer) arm(d time.Duration, f func()) {
	if o.armed {
		return
	}
	o.armed = true
	if o.t == nil {
		o.t = time.AfterFunc(d, f)
	} else {
		o.t.Reset(d)
	}
}

// fired records that the timer ran, so the next arm starts it again.
func (o *onceTimer) fired() { o.armed = false }

// stop stops the timer if it was ever made.
func (o *onceTimer) stop() {
	if o.t != nil {
		o.t.Stop()
	}
}
