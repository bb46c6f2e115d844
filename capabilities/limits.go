package capabilities

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Limits are a tool's per-call limits. A zero field means the host's
// default for it (wasmtools.Config: 10 s, 256 MiB, 1 MiB of output, a
// 1 GiB write quota unless configured otherwise).
//
// In a manifest's requests, a limit at or under the default applies as
// asked (a tool may ask for less); one above it needs a grant of at least
// that much, and calls are denied until the user grants it. In grants,
// a field is the most the user allows the tool to ask for.
type Limits struct {
	// TimeoutMS bounds a whole call, in milliseconds.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MemoryMiB caps an instance's linear memory and tables, in MiB; at
	// most 4096.
	MemoryMiB int64 `json:"memory_mib,omitempty"`
	// OutputBytes caps what one call may write to stdout or return.
	OutputBytes int64 `json:"output_bytes,omitempty"`
	// WriteQuotaBytes caps what one call may write through each
	// read-write grant.
	WriteQuotaBytes int64 `json:"write_quota_bytes,omitempty"`
}

// MaxMemoryMiB is the most a 32-bit WebAssembly memory can address.
const MaxMemoryMiB = 4 << 10

// field is one of Limits' fields, by its JSON name.
type field struct {
	name string
	v    *int64
}

// fields returns l's fields in declaration order, for the methods that
// treat them all alike.
func (l *Limits) fields() [4]field {
	return [4]field{{"timeout_ms", &l.TimeoutMS}, {"memory_mib", &l.MemoryMiB}, {"output_bytes", &l.OutputBytes}, {"write_quota_bytes", &l.WriteQuotaBytes}}
}

// Check reports a negative field, or a memory limit over MaxMemoryMiB.
func (l Limits) Check() error {
	for _, f := range l.fields() {
		if *f.v < 0 {
			return fmt.Errorf("limits %s %d is negative", f.name, *f.v)
		}
	}
	if l.MemoryMiB > MaxMemoryMiB {
		return fmt.Errorf("limits memory_mib %d is more than a WebAssembly memory can hold (%d)", l.MemoryMiB, MaxMemoryMiB)
	}
	return nil
}

// Add returns l with the non-zero fields of more replacing its own.
func (l Limits) Add(more Limits) Limits {
	dst := l.fields()
	for i, f := range more.fields() {
		if *f.v != 0 {
			*dst[i].v = *f.v
		}
	}
	return l
}

// Without returns l with the fields that are non-zero in these cleared.
func (l Limits) Without(these Limits) Limits {
	dst := l.fields()
	for i, f := range these.fields() {
		if *f.v != 0 {
			*dst[i].v = 0
		}
	}
	return l
}

// LimitKinds are the names ParseLimit takes, in the order of Limits.
var LimitKinds = []string{"timeout", "memory", "output", "write_quota"}

// ErrBadLimit is what ParseLimit returns for a spec it cannot read.
var ErrBadLimit = errors.New("want timeout=DURATION (e.g. 30s), memory=SIZE (e.g. 512MiB), output=SIZE or write_quota=SIZE")

// ParseLimit reads one limit as the CLI writes it, KIND=VALUE: timeout
// takes a Go duration ("30s", "2m"), memory, output and write_quota a
// size in bytes with an optional unit KiB, MiB or GiB ("512MiB"; memory
// is kept in whole MiB). With value false it reads KIND alone and sets
// that field to 1, to name the limit (for a revoke).
func ParseLimit(spec string, value bool) (Limits, error) {
	kind, val, hasVal := strings.Cut(spec, "=")
	var l Limits
	if !value {
		if hasVal {
			return l, fmt.Errorf("limit %q: name the limit only (%s): %w", spec, strings.Join(LimitKinds, ", "), ErrBadLimit)
		}
		val = "1"
	}
	var err error
	switch kind {
	case "timeout":
		var d time.Duration
		if !value {
			d = time.Millisecond
		} else if d, err = time.ParseDuration(val); err == nil && d < time.Millisecond {
			err = errors.New("under a millisecond")
		}
		l.TimeoutMS = d.Milliseconds()
	case "memory":
		var n int64
		if n, err = parseSize(val, value); err == nil {
			if l.MemoryMiB = n >> 20; !value {
				l.MemoryMiB = 1
			} else if n%(1<<20) != 0 || n == 0 {
				err = errors.New("memory is granted in whole MiB")
			}
		}
	case "output":
		l.OutputBytes, err = parseSize(val, value)
	case "write_quota":
		l.WriteQuotaBytes, err = parseSize(val, value)
	default:
		return l, fmt.Errorf("limit %q: unknown limit %q: %w", spec, kind, ErrBadLimit)
	}
	if err == nil && value && !hasVal {
		err = errors.New("no value")
	}
	if err == nil {
		err = l.Check()
	}
	if err != nil {
		return Limits{}, fmt.Errorf("limit %q: %v: %w", spec, err, ErrBadLimit)
	}
	return l, nil
}

// parseSize reads a positive size: a number with an optional unit B,
// KiB, MiB or GiB.
func parseSize(s string, value bool) (int64, error) {
	if !value {
		return 1, nil
	}
	unit := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, unit = rest, u.n
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("%q is not a positive size", s)
	}
	return n * unit, nil
}

// Specs renders the non-zero fields of l as ParseLimit reads them
// ("timeout=30s", "memory=512MiB"), in the order of LimitKinds.
func (l Limits) Specs() []string {
	var out []string
	if l.TimeoutMS != 0 {
		out = append(out, "timeout="+(time.Duration(l.TimeoutMS)*time.Millisecond).String())
	}
	if l.MemoryMiB != 0 {
		out = append(out, fmt.Sprintf("memory=%dMiB", l.MemoryMiB))
	}
	if l.OutputBytes != 0 {
		out = append(out, "output="+formatSize(l.OutputBytes))
	}
	if l.WriteQuotaBytes != 0 {
		out = append(out, "write_quota="+formatSize(l.WriteQuotaBytes))
	}
	return out
}

// formatSize writes n in the largest unit that divides it exactly.
func formatSize(n int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}
