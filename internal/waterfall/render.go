package waterfall

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
)

// Options shape Render's text. The zero value is usable.
type Options struct {
	// Width is the width of a line in columns, bar included; default
	// (<= 0) DefaultWidth. The bar gets what the other columns leave, at
	// least MinBar columns (a line is then wider than Width).
	Width int
}

// DefaultWidth is the line width Render uses when none is given.
const DefaultWidth = 120

// MinBar is the narrowest bar Render draws.
const MinBar = 10

const (
	maxName   = 56 // widest span column (indent and label)
	minName   = 24 // narrowest span column, when the bar needs room
	maxIndent = 16 // depths past this are shown as "[depth]", not indented further
	maxStatus = 40 // widest status (an error's reason is shortened to fit)
	minStatus = 16 // narrowest status column, when the bar needs room
)

// The marks of a line, readable without colour.
const (
	MarkCritical = '*' // first column: on the critical path
	MarkError    = '!' // second column: the span failed
)

// Bar characters: a span's time, the tip of a running span's bar (it
// goes on), and a span that took no time.
const (
	barFill = '='
	barOpen = '>'
	barZero = '|'
)

// Render writes t to w as a waterfall: a header line, then a line per
// span, depth first:
//
//	MARKS START DURATION SPAN [BAR] TOKENS COST STATUS
//
// MARKS are MarkCritical and MarkError; START is the span's offset from
// the trace's start; SPAN is its kind and name, indented by depth; the
// bar spans the trace's duration; TOKENS are prompt/completion; STATUS
// is ok, running or error with its reason, shortened. It returns w's
// error.
func Render(w io.Writer, t *Tree, o Options) error {
	width := o.Width
	if width <= 0 {
		width = DefaultWidth
	}
	rows := make([]row, len(t.nodes))
	startW, durW, nameW, tokW, costW, statusW := len("START"), len("DURATION"), len("SPAN"), len("TOKENS"), len("COST"), len("STATUS")
	for i, n := range t.nodes {
		r := &rows[i]
		r.start, r.dur = formatDuration(n.Offset), formatDuration(n.Duration)
		r.name = label(n)
		r.tokens, r.cost, r.status = tokens(n.Span), cost(n.Span.CostUSD), status(n)
		startW, durW = max(startW, utf8.RuneCountInString(r.start)), max(durW, utf8.RuneCountInString(r.dur))
		tokW, costW = max(tokW, len(r.tokens)), max(costW, len(r.cost))
		nameW = max(nameW, utf8.RuneCountInString(r.name))
		statusW = max(statusW, utf8.RuneCountInString(r.status))
	}
	nameW = min(nameW, maxName)
	// marks(2) start dur name [bar] tokens cost status
	fixed := func() int { return 2 + 1 + startW + 1 + durW + 1 + nameW + 1 + 2 + 1 + tokW + 1 + costW + 1 + statusW }
	barW := width - fixed()
	if barW < MinBar && nameW > minName {
		nameW = max(minName, nameW-(MinBar-barW))
		barW = width - fixed()
	}
	if barW < MinBar && statusW > minStatus {
		statusW = max(minStatus, statusW-(MinBar-barW))
		barW = width - fixed()
	}
	barW = max(barW, MinBar)

	var b bytes.Buffer
	const flushAt = 64 << 10
	b.Grow(min((width+16)*(len(rows)+1), flushAt+4*(width+16)))
	b.WriteString("  ")
	padLeft(&b, "START", startW)
	b.WriteByte(' ')
	padLeft(&b, "DURATION", durW)
	b.WriteByte(' ')
	padRight(&b, "SPAN", nameW)
	b.WriteString(" [")
	axis(&b, t.Duration, barW)
	b.WriteString("] ")
	padLeft(&b, "TOKENS", tokW)
	b.WriteByte(' ')
	padLeft(&b, "COST", costW)
	b.WriteString(" STATUS\n")

	cells := make([]byte, barW)
	for i, n := range t.nodes {
		r := &rows[i]
		if n.Critical {
			b.WriteByte(MarkCritical)
		} else {
			b.WriteByte(' ')
		}
		if n.Span.Status == keel.SpanError {
			b.WriteByte(MarkError)
		} else {
			b.WriteByte(' ')
		}
		b.WriteByte(' ')
		padLeft(&b, r.start, startW)
		b.WriteByte(' ')
		padLeft(&b, r.dur, durW)
		b.WriteByte(' ')
		padRight(&b, clip(r.name, nameW), nameW)
		b.WriteString(" [")
		bar(cells, n, t.Duration)
		b.Write(cells)
		b.WriteString("] ")
		padLeft(&b, r.tokens, tokW)
		b.WriteByte(' ')
		padLeft(&b, r.cost, costW)
		b.WriteByte(' ')
		b.WriteString(clip(r.status, statusW))
		b.WriteByte('\n')
		if b.Len() >= flushAt {
			if _, err := w.Write(b.Bytes()); err != nil {
				return err
			}
			b.Reset()
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// row is a node's text, before padding.
type row struct {
	start, dur, name, tokens, cost, status string
}

// bar fills cells with n's bar on a scale of total.
func bar(cells []byte, n *Node, total time.Duration) {
	for i := range cells {
		cells[i] = ' '
	}
	w := len(cells)
	if total <= 0 {
		cells[0] = barZero
		if n.Duration > 0 || n.Open {
			cells[0] = barFill
		}
		return
	}
	// at is the cell where time d falls: float64 keeps d*w from
	// overflowing, multiplying first keeps exact fractions exact.
	at := func(d time.Duration) float64 { return float64(d) * float64(w) / float64(total) }
	from := min(int(at(n.Offset)), w-1)
	if n.Duration == 0 && !n.Open {
		cells[from] = barZero
		return
	}
	to := min(max(int(math.Ceil(at(n.End()))), from+1), w)
	for i := from; i < to; i++ {
		cells[i] = barFill
	}
	if n.Open {
		cells[to-1] = barOpen
	}
}

// axis writes the bar column's header: 0 at the left, the trace's
// duration at the right.
func axis(b *bytes.Buffer, total time.Duration, w int) {
	right := formatDuration(total)
	if len(right)+2 > w {
		padRight(b, "", w)
		return
	}
	b.WriteByte('0')
	b.WriteString(strings.Repeat(" ", w-1-len(right)))
	b.WriteString(right)
}

// Label names a span for a line of the waterfall: its kind, then what it
// ran. A run's root names the run's kind and ID (a sub-agent's root says
// which run it is); an agent run's step its number; a plan step its ID;
// a model call PROVIDER/MODEL; others their name (a tool's).
func Label(s keel.Span) string {
	switch s.Kind {
	case keel.SpanRun:
		return "run " + s.Name + " " + string(s.RunID)
	case keel.SpanStep:
		if s.Name == "step" || s.Name == "" {
			return "step " + strconv.Itoa(s.Step)
		}
		return "step " + s.Name
	case keel.SpanModelCall:
		if s.Provider != "" && !strings.HasPrefix(s.Name, s.Provider+"/") {
			return "model.call " + s.Provider + "/" + s.Name
		}
	}
	if s.Name == "" || s.Name == string(s.Kind) {
		return string(s.Kind)
	}
	return string(s.Kind) + " " + s.Name
}

// label is n's Label, indented by its depth.
func label(n *Node) string {
	l := strings.TrimSpace(Label(n.Span))
	if n.Depth <= maxIndent {
		return strings.Repeat("  ", n.Depth) + l
	}
	return strings.Repeat("  ", maxIndent) + "[" + strconv.Itoa(n.Depth) + "] " + l
}

func tokens(s keel.Span) string {
	if s.PromptTokens == 0 && s.CompletionTokens == 0 {
		return "-"
	}
	return strconv.Itoa(s.PromptTokens) + "/" + strconv.Itoa(s.CompletionTokens)
}

func cost(usd float64) string {
	switch {
	case usd <= 0:
		return "-"
	case usd >= 0.01:
		return fmt.Sprintf("$%.2f", usd)
	}
	return fmt.Sprintf("$%.6f", usd)
}

// status is a span's outcome for its line: ok, running, or error and
// the first line of its reason, shortened to maxStatus.
func status(n *Node) string {
	switch {
	case n.Open:
		return "running"
	case n.Span.Status == keel.SpanError:
		reason, _, _ := strings.Cut(strings.TrimSpace(n.Span.Error), "\n")
		if reason == "" {
			return "error"
		}
		return clip("error: "+reason, maxStatus)
	case n.Span.Status == "":
		return "?"
	}
	return string(n.Span.Status)
}

// formatDuration writes d compactly, to three significant digits or so:
// 0s, 850µs, 12ms, 1.25s, 2m05s, 3h07m.
func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return strconv.FormatInt(int64(d/time.Microsecond), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// clip shortens s to n runes, the last an ellipsis.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func padLeft(b *bytes.Buffer, s string, w int) {
	for i := utf8.RuneCountInString(s); i < w; i++ {
		b.WriteByte(' ')
	}
	b.WriteString(s)
}

func padRight(b *bytes.Buffer, s string, w int) {
	b.WriteString(s)
	for i := utf8.RuneCountInString(s); i < w; i++ {
		b.WriteByte(' ')
	}
}
