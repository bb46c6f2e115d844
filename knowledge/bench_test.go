package knowledge

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkNearest is the exact vector scan of a query against the
// standard library's chunk count (128,637) of 64-dimensional vectors, the
// tiny model's (bench/knowledge measures the whole search).
func BenchmarkNearest(b *testing.B) {
	for _, dim := range []int{64, 768} {
		b.Run(map[int]string{64: "dim64", 768: "dim768"}[dim], func(b *testing.B) {
			const n = 128637
			r := rand.New(rand.NewPCG(1, 2))
			v := &vecSet{dim: dim, ids: make([]int64, n), vecs: make([]float32, n*dim)}
			for i := range v.ids {
				v.ids[i] = int64(i)
			}
			for i := range v.vecs {
				v.vecs[i] = r.Float32()
			}
			q := make([]float32, dim)
			for i := range q {
				q[i] = r.Float32()
			}
			b.ResetTimer()
			for b.Loop() {
				h := &topK{}
				v.nearest(q, 128, h)
			}
		})
	}
}
