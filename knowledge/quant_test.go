package knowledge

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// synthVecs returns n normalized vectors of dim and queries: isotropic
// noise, or clustered around 300 centres with an offset shared by all
// (as real embeddings are: anisotropic, in clusters).
func synthVecs(kind string, n, dim, queries int) (*vecSet, [][]float32) {
	r := rand.New(rand.NewPCG(3, 4))
	var centres [][]float32
	offset := make([]float32, dim)
	if kind == "clustered" {
		for d := range offset {
			offset[d] = float32(r.NormFloat64()) * 1.5
		}
		for range 300 {
			c := make([]float32, dim)
			for d := range c {
				c[d] = float32(r.NormFloat64())
			}
			centres = append(centres, c)
		}
	}
	draw := func(noise float32) []float32 {
		x := make([]float32, dim)
		var c []float32
		if centres != nil {
			c = centres[r.IntN(len(centres))]
		}
		var s float64
		for d := range x {
			x[d] = float32(r.NormFloat64())
			if c != nil {
				x[d] = offset[d] + c[d] + noise*x[d]
			}
			s += float64(x[d]) * float64(x[d])
		}
		for d := range x {
			x[d] /= float32(math.Sqrt(s))
		}
		return x
	}
	v := &vecSet{dim: dim}
	for i := range n {
		v.ids = append(v.ids, int64(i))
		v.vecs = append(v.vecs, draw(0.6)...)
	}
	var qs [][]float32
	for range queries {
		qs = append(qs, draw(1))
	}
	return v, qs
}

// TestQuantizedRecall: the two-pass search (codes, then the candidates
// exactly) finds the exact scan's best k.
func TestQuantizedRecall(t *testing.T) {
	t.Parallel()
	const n, dim, k = 2 * quantMin, 8, 32
	testRecall(t, n, dim, k, 4, "isotropic", "clustered")
}

// TestSignedRecall: with the sign pass first (a set of at least
// 2*signFactor candidates), the search still finds the exact best k (on
// clustered data only: the set is large, and slow to draw under -race).
func TestSignedRecall(t *testing.T) {
	t.Parallel()
	const k = 32
	testRecall(t, 2*signFactor*candidates(k), 32, k, 2, "clustered")
}

func testRecall(t *testing.T, n, dim, k, queries int, kinds ...string) {
	for _, kind := range kinds {
		v, qs := synthVecs(kind, n, dim, queries)
		v.q = buildQuant(v.vecs, v.dim)
		found := 0
		for _, q := range qs {
			exact, approx := newTopK[int64](k), newTopK[int64](k)
			v.scan(q, exact, 0, n)
			v.nearest(q, approx)
			got := map[int64]bool{}
			for _, s := range approx.best() {
				got[s.id] = true
			}
			for _, s := range exact.a {
				if got[s.id] {
					found++
				}
			}
		}
		recall := float64(found) / float64(k*len(qs))
		t.Logf("%s: recall@%d %.3f (%d vectors, %d candidates)", kind, k, recall, n, candidates(k))
		if recall < 0.98 {
			t.Errorf("%s: recall@%d = %.3f, want >= 0.98", kind, k, recall)
		}
	}
}

// TestQuantizedUpdate: vectors removed from and added to a coded set in
// place keep its codes in step: an added vector is found as its own
// nearest, a removed one never.
func TestQuantizedUpdate(t *testing.T) {
	t.Parallel()
	v, qs := synthVecs("clustered", 12000, 8, 2)
	v.model = "m"
	v.q = buildQuant(v.vecs, v.dim)
	c := &vectorCache{sets: map[Scope]*vecSet{ScopeUser: v}}
	gone := []int64{0, 5, 11999, 1234}
	c.update(ScopeUser, "m", "", gone, []int64{50000, 7}, [][]float32{qs[0], qs[1]}) // 7 is replaced
	if n := len(v.ids); n != 12000-len(gone)+1 || len(v.vecs) != n*v.dim || len(v.q.scale) != n || len(v.q.codes) != n*v.q.words || len(v.q.signs) != n*v.q.sw {
		t.Fatalf("after update: %d ids, %d floats, %d scales, %d code words; want %d vectors in each", n, len(v.vecs), len(v.q.scale), len(v.q.codes), 12000-len(gone)+1)
	}
	for i, want := range []int64{50000, 7} {
		h := newTopK[int64](1)
		v.nearest(normalizeInto(nil, encodeVec(qs[i])), h)
		if got := h.best(); len(got) != 1 || got[0].id != want || got[0].sim < 0.999 {
			t.Errorf("nearest(vector %d) = %+v, want id %d with similarity 1", want, got, want)
		}
	}
	for i := range v.ids { // every code is its vector's
		fresh := &quant{words: v.q.words, sw: v.q.sw, mean: v.q.mean}
		fresh.add(v.vecs[i*v.dim : (i+1)*v.dim])
		w, sw := v.q.words, v.q.sw
		if !slices.Equal(fresh.codes, v.q.codes[i*w:(i+1)*w]) || fresh.scale[0] != v.q.scale[i] || !slices.Equal(fresh.signs, v.q.signs[i*sw:(i+1)*sw]) {
			t.Fatalf("vector %d (id %d): code %x scale %v signs %x, want %x %v %x", i, v.ids[i], v.q.codes[i*w:(i+1)*w], v.q.scale[i], v.q.signs[i*sw:(i+1)*sw], fresh.codes, fresh.scale[0], fresh.signs)
		}
	}
	for _, id := range gone {
		if _, ok := v.pos[id]; ok || slices.Contains(v.ids, id) {
			t.Errorf("id %d still in the set after its removal", id)
		}
	}
}
