// Package timing holds what the side-by-side benchmarks share to time a
// call: many timed calls after untimed warm ones, and their percentiles.
package timing

import (
	"runtime"
	"slices"
	"time"
)

// Measure times n calls of f, after a few untimed ones (the first fills
// caches and pools) and a garbage collection. It stops at f's first
// error.
func Measure(n int, f func() error) ([]time.Duration, error) {
	for range min(n/10+1, 100) {
		if err := f(); err != nil {
			return nil, err
		}
	}
	runtime.GC()
	d := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		d = append(d, time.Since(start))
	}
	return d, nil
}

// Pct is the p-th quantile (0..1) of d, rounded to the microsecond; d is
// not modified. d must not be empty.
func Pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)].Round(time.Microsecond)
}

// MeasureTurns times n calls of each of fs taken in turns (one call of
// each per round, in a rotating order), after a few untimed rounds and
// a garbage collection, so that every f meets the same load on a busy
// machine; d[i] holds fs[i]'s times. It stops at the first error, which
// names the index of the f that failed.
func MeasureTurns(n int, fs ...func() error) (d [][]time.Duration, err error) {
	for range min(n/10+1, 100) {
		for i, f := range fs {
			if err := f(); err != nil {
				return nil, &TurnError{i, err}
			}
		}
	}
	runtime.GC()
	d = make([][]time.Duration, len(fs))
	for i := range d {
		d[i] = make([]time.Duration, 0, n)
	}
	for round := range n {
		for k := range fs {
			i := (round + k) % len(fs)
			start := time.Now()
			if err := fs[i](); err != nil {
				return nil, &TurnError{i, err}
			}
			d[i] = append(d[i], time.Since(start))
		}
	}
	return d, nil
}

// TurnError is MeasureTurns' error: the call of fs[Index] failed.
type TurnError struct {
	Index int
	Err   error
}

func (e *TurnError) Error() string { return e.Err.Error() }
func (e *TurnError) Unwrap() error { return e.Err }
