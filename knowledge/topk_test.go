package knowledge

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTopK: the heap keeps the k highest of any sequence, and best
// returns them highest first.
func TestTopK(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{1, 3, 64} {
		for _, n := range []int{0, 2, 64, 1000} {
			sims := make([]float32, n)
			h := newTopK[int32](k)
			for i := range sims {
				sims[i] = float32(r.IntN(50)) // ties too
				h.push(int32(i), sims[i])
			}
			got := h.best()
			want := slices.Clone(sims)
			slices.SortFunc(want, func(a, b float32) int { return int(b - a) })
			want = want[:min(k, n)]
			gotSims := make([]float32, len(got))
			for i, s := range got {
				gotSims[i] = s.sim
				if sims[s.id] != s.sim {
					t.Fatalf("k=%d n=%d: entry %d has sim %v, pushed with %v", k, n, s.id, s.sim, sims[s.id])
				}
			}
			if !slices.Equal(gotSims, want) {
				t.Errorf("k=%d n=%d: best() = %v, want %v", k, n, gotSims, want)
			}
			if len(h.a) != 0 {
				t.Errorf("k=%d n=%d: %d entries left after best()", k, n, len(h.a))
			}
		}
	}
}
