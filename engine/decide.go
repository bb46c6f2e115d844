package engine

import (
	"errors"
	"sync"

	"github.com/keel-runtime/keel"
)

// runLocks holds one mutex per run, made on first use and dropped when
// no one holds or waits for it. The zero value is ready.
type runLocks struct {
	mu sync.Mutex
	m  map[keel.RunID]*runLock
}

type runLock struct {
	sync.Mutex
	users int // holders and waiters
}

// lock locks run id's mutex and returns the func that unlocks it.
func (l *runLocks) lock(id keel.RunID) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[keel.RunID]*runLock{}
	}
	rl := l.m[id]
	if rl == nil {
		rl = &runLock{}
		l.m[id] = rl
	}
	rl.users++
	l.mu.Unlock()
	rl.Lock()
	return func() {
		rl.Unlock()
		l.mu.Lock()
		if rl.users--; rl.users == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}

// answer is the journaled answer to a wait: a decision or an approval,
// and the event that recorded it.
type answer struct {
	what string
	seq  int64
}

// decided returns the error for a decision or approval about call of
// run id that a earlier one, a, answered.
func decided(id keel.RunID, call string, a answer) error {
	return &keel.AlreadyDecidedError{RunID: id, CallID: call, Decision: a.what, Seq: a.seq}
}

// launchAnswered launches the loop of a run whose wait was just answered.
// A wait's answer can come while the loop that journaled the wait is
// still on its way out; the run then goes on as soon as that loop is done
// (see finish) instead of failing with keel.ErrConflict, which would leave
// a journaled answer that nothing acts on until a restart.
func (e *Engine) launchAnswered(run keel.Run) error {
	err := e.launch(run)
	if !errors.Is(err, keel.ErrConflict) {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, busy := e.active[run.ID]; !busy {
		return err // cannot be: only finish removes it, and it relaunches
	}
	if e.again == nil {
		e.again = map[keel.RunID]bool{}
	}
	e.again[run.ID] = true
	return nil
}
