package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoStream is wrapped by the error of an elicitation over HTTP whose
// client did not open the session's notification stream (the GET of
// streamable HTTP) within HTTPConfig.StreamWait: with responses sent as
// single JSON bodies, the server's own requests go on that stream.
var ErrNoStream = errors.New("the client has no notification stream (GET) open to be asked on")

// streams follows which HTTP sessions have their notification stream
// open, so that an elicitation can wait for it. Clients open it right
// after initialize, but without waiting for it (the TypeScript SDK's, for
// one): a call made at once may otherwise ask before it is there. Safe
// for concurrent use.
type streams struct {
	mu      sync.Mutex
	open    map[string]int             // session ID → streams open
	waiters map[string][]chan struct{} // session ID → waits, closed when one opens
}

// opened notes a stream of session id ready to carry messages.
func (st *streams) opened(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.open == nil {
		st.open = map[string]int{}
	}
	st.open[id]++
	for _, ch := range st.waiters[id] {
		close(ch)
	}
	delete(st.waiters, id)
}

// closed notes the end of a stream of session id that opened.
func (st *streams) closed(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.open[id]--; st.open[id] <= 0 {
		delete(st.open, id)
	}
}

// testHookStreamWait, when set, is called with the session ID when an
// elicitation starts waiting for the session's stream.
var testHookStreamWait atomic.Pointer[func(session string)]

// wait returns nil once session id has a stream open, at once if it has;
// an error wrapping ErrNoStream if none opened within d, or ctx's error.
func (st *streams) wait(ctx context.Context, id string, d time.Duration) error {
	st.mu.Lock()
	if st.open[id] > 0 {
		st.mu.Unlock()
		return nil
	}
	if st.waiters == nil {
		st.waiters = map[string][]chan struct{}{}
	}
	ch := make(chan struct{})
	st.waiters[id] = append(st.waiters[id], ch)
	st.mu.Unlock()
	if hook := testHookStreamWait.Load(); hook != nil {
		(*hook)(id)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-ch:
		return nil
	case <-t.C:
		err = ErrNoStream
	case <-ctx.Done():
		err = ctx.Err()
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if w := slices.DeleteFunc(st.waiters[id], func(c chan struct{}) bool { return c == ch }); len(w) > 0 {
		st.waiters[id] = w
	} else {
		delete(st.waiters, id)
	}
	return err
}

// streamWriter is the response writer of a GET: its first Flush (the
// SDK flushes the stream's headers once it is ready to carry messages)
// calls ready.
type streamWriter struct {
	http.ResponseWriter
	ready func()
	done  bool
}

func (w *streamWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	if !w.done {
		w.done = true
		w.ready()
	}
}

// Unwrap is for http.ResponseController.
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
