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
