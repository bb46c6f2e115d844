package knowledge

import (
	"cmp"
	"slices"
)

// scored is an id (a chunk's row id, or a vector's index in its set) and
// its similarity to the query.
type scored[T any] struct {
	id  T
	sim float32
}

// topK keeps the k entries of highest similarity pushed to it: a
// min-heap, the worst kept at [0], so that most entries of a scan are
// turned away by one comparison. Both passes of a vector search use it
// (the chunks' exact scores, and the candidates of the coded pass).
type topK[T any] struct {
	k int
	a []scored[T]
}

func newTopK[T any](k int) *topK[T] { return &topK[T]{k: k, a: make([]scored[T], 0, min(k, 1<<16))} }

// full reports whether k entries are kept; the worst of them is then
// a[0].
func (h *topK[T]) full() bool { return len(h.a) >= h.k }

// push keeps (id, sim) if it is among the best k.
func (h *topK[T]) push(id T, sim float32) {
	a := h.a
	if len(a) < h.k {
		a = append(a, scored[T]{id, sim})
		for j := len(a) - 1; j > 0; { // sift up
			p := (j - 1) / 2
			if a[p].sim <= a[j].sim {
				break
			}
			a[p], a[j] = a[j], a[p]
			j = p
		}
		h.a = a
		return
	}
	if sim <= a[0].sim {
		return
	}
	a[0] = scored[T]{id, sim}
	for j := 0; ; { // sift down
		l := 2*j + 1
		if l >= len(a) {
			break
		}
		m := l
		if r := l + 1; r < len(a) && a[r].sim < a[l].sim {
			m = r
		}
		if a[j].sim <= a[m].sim {
			break
		}
		a[j], a[m] = a[m], a[j]
		j = m
	}
}

// best returns the entries kept, the most similar first, and empties h.
func (h *topK[T]) best() []scored[T] {
	out := slices.Clone(h.a)
	slices.SortFunc(out, func(a, b scored[T]) int { return cmp.Compare(b.sim, a.sim) })
	h.a = h.a[:0]
	return out
}
