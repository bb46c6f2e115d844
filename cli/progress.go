package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is the one way the CLI shows a slow operation advancing: a
// model pull, the daemon compiling its tools, a tool's validation and
// compile on install. On a terminal it draws one line, redrawn in place,
// with github.com/schollz/progressbar: the status, then a bar when the
// size is known (bytes, or items such as tools) or a spinner and the
// elapsed time when it is not. Anywhere else (a pipe, a file, a log) it
// prints a plain line each time the status changes, and no bar.
//
// A progress is used by one goroutine. Call end when the operation is
// over, whatever its outcome: it removes the bar, so that an error
// printed next stands on its own line and nothing claims "done" for an
// operation that failed.
type progress struct {
	w        io.Writer
	terminal bool
	bytes    bool // sizes are bytes (else counts of items)
	bar      *progressbar.ProgressBar
	max      int64  // the bar's size; -1: unknown (a spinner)
	status   string // the last status shown
	line     string // the last plain line printed
}

// newProgress returns a progress drawn on w; bytes says whether the sizes
// it is given are bytes. It draws a bar only when terminal is true (see
// isTerminal).
func newProgress(w io.Writer, terminal, bytes bool) *progress {
	return &progress{w: w, terminal: terminal, bytes: bytes, max: -1}
}

// set shows status with done of total (total <= 0: no size known).
func (p *progress) set(status string, done, total int64) {
	if !p.terminal {
		// A line per status; for counts, a line per item done too.
		line := status
		switch {
		case total > 0 && p.bytes:
			line = fmt.Sprintf("%s (%s)", status, formatBytes(total))
		case total > 0:
			line = fmt.Sprintf("%s: %d of %d done", status, done, total)
		}
		if status == p.status && (p.bytes || line == p.line) {
			return
		}
		p.status, p.line = status, line
		fmt.Fprintln(p.w, line)
		return
	}
	if total <= 0 {
		total = -1
	}
	switch {
	case p.bar == nil || (total < 0) != (p.max < 0):
		// A bar where there was a spinner, or the reverse.
		p.end()
		p.bar = p.newBar(status, total)
		p.max, p.status = total, status
		_ = p.bar.RenderBlank()
	case total != p.max:
		p.bar.Reset()
		p.bar.ChangeMax64(total)
		p.max = total
	}
	if status != p.status {
		p.bar.Describe(status)
		p.status = status
	}
	if total < 0 {
		p.tick()
	} else {
		_ = p.bar.Set64(min(max(done, 0), total))
	}
}

// newBar returns a bar of size total showing status, or a spinner with
// the elapsed time when total is -1.
func (p *progress) newBar(status string, total int64) *progressbar.ProgressBar {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(status),
		progressbar.OptionSetWidth(24),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSpinnerType(14),
		// Redraw only when told: no goroutine of the library's own
		// outlives the operation.
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionUseANSICodes(true),
	}
	if total < 0 {
		opts = append(opts, progressbar.OptionSetElapsedTime(true))
	} else {
		opts = append(opts, progressbar.OptionSetElapsedTime(false), progressbar.OptionShowBytes(p.bytes), progressbar.OptionShowCount())
	}
	return progressbar.NewOptions64(total, opts...)
}

// tick advances the spinner and redraws the elapsed time, for an
// operation that reports nothing while it runs.
func (p *progress) tick() {
	if p.bar != nil && p.max < 0 {
		_ = p.bar.Add64(1) // a step of the spinner
	}
}

// end removes the bar, if one is drawn; the terminal line is then empty
// and the cursor at its start.
func (p *progress) end() {
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
		p.bar = nil
	}
}

// during runs f while p shows status, redrawn every half second so the
// spinner and elapsed time move, and ends p when f returns. On success it
// prints "status done in D" on a line of its own; on failure nothing:
// the caller reports the error.
func (p *progress) during(status string, f func() error) error {
	start := time.Now()
	p.set(status, 0, 0)
	stop, stopped := make(chan struct{}), make(chan struct{})
	if p.terminal {
		go func() {
			defer close(stopped)
			t := time.NewTicker(500 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					p.tick()
				}
			}
		}()
	} else {
		close(stopped)
	}
	err := f()
	close(stop)
	<-stopped
	p.end()
	if err == nil {
		fmt.Fprintf(p.w, "%s done in %s\n", status, time.Since(start).Round(time.Millisecond))
	}
	return err
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
