package knowledge

import (
	"fmt"
	"testing"
)

// BenchmarkNearest is the vector search of a query against the standard
// library's chunk count (128,637) of 64-dimensional vectors, the tiny
// model's, and of 768 (a real embedding model's): "exact" scans every
// vector, "quant" is the two passes over the codes (quant.go).
// bench/knowledge measures the whole search.
func BenchmarkNearest(b *testing.B) {
	for _, dim := range []int{64, 768} {
		v, qs := synthVecs("clustered", 128637, dim, 1)
		for _, mode := range []string{"exact", "quant"} {
			b.Run(fmt.Sprintf("dim%d/%s", dim, mode), func(b *testing.B) {
				v.q = nil
				if mode == "quant" {
					v.q = buildQuant(v.vecs, v.dim)
				}
				for b.Loop() {
					v.nearest(qs[0], newTopK[int64](32))
				}
			})
		}
	}
}
