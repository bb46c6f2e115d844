package knowledge

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkNearest is the vector search of a query against the standard
// library's chunk count (128,637) of 64-dimensional vectors, the tiny
// model's, and of 768 (a real embedding model's): "exact" scans every
// vector, "coded" is the two passes over the 2-bit codes alone, "signs"
// the sign pass before them (quant.go). Each reports its recall of the
// exact best 32 over the queries it ran. bench/knowledge measures the
// whole search.
func BenchmarkNearest(b *testing.B) {
	const k = 32
	for _, dim := range []int{64, 768} {
		v, qs := synthVecs("clustered", 128637, dim, 16)
		want := make([]map[int64]bool, len(qs))
		for i, q := range qs {
			h := newTopK[int64](k)
			v.scan(q, h, 0, len(v.ids))
			want[i] = map[int64]bool{}
			for _, s := range h.a {
				want[i][s.id] = true
			}
		}
		for _, mode := range []string{"exact", "coded", "signs"} {
			b.Run(fmt.Sprintf("dim%d/%s", dim, mode), func(b *testing.B) {
				v.q = nil
				if mode != "exact" {
					v.q = buildQuant(v.vecs, v.dim)
				}
				if mode == "coded" {
					v.q.signs = nil
				}
				found, all := 0, 0
				for i := 0; b.Loop(); i++ {
					h := newTopK[int64](k)
					v.nearest(qs[i%len(qs)], h)
					for _, s := range h.a {
						if want[i%len(qs)][s.id] {
							found++
						}
					}
					all += k
				}
				b.ReportMetric(float64(found)/float64(all), "recall")
			})
		}
	}
}

// BenchmarkNearestTurns times the coded and the signed search of 64
// dimensions in turns (one of each per round, in a rotating order), so
// that both meet the same load on a busy machine: the p50 of each, and
// the process's CPU time per search.
func BenchmarkNearestTurns(b *testing.B) {
	v, qs := synthVecs("clustered", 128637, 64, 16)
	signed := buildQuant(v.vecs, v.dim)
	coded := *signed
	coded.signs = nil
	sets := []*vecSet{
		{dim: v.dim, ids: v.ids, vecs: v.vecs, q: &coded},
		{dim: v.dim, ids: v.ids, vecs: v.vecs, q: signed},
	}
	wall := make([][]time.Duration, len(sets))
	cpu := make([]time.Duration, len(sets))
	for round := 0; b.Loop(); round++ {
		for k := range sets {
			i := (round + k) % len(sets)
			c0, t0 := cpuTime(), time.Now()
			sets[i].nearest(qs[round%len(qs)], newTopK[int64](32))
			wall[i] = append(wall[i], time.Since(t0))
			cpu[i] += cpuTime() - c0
		}
	}
	for i, name := range []string{"coded", "signs"} {
		slices.Sort(wall[i])
		b.ReportMetric(float64(wall[i][len(wall[i])/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(cpu[i].Microseconds())/1000/float64(len(wall[i])), name+"-cpu-ms")
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
