package knowledge

import (
	"math"
	"math/bits"
	"runtime"
	"sync"
)

// A large vector set is searched in two passes. Each vector is also kept
// as a 2-bit code of its residual from the set's mean (four levels per
// dimension, Lloyd-Max for a normal distribution, scaled by the
// residual's RMS): 16 bytes for 64 dimensions instead of 256. The first
// pass estimates every vector's similarity from its code, 8 table
// lookups per 32 dimensions (the tables are built from the query once),
// and keeps the best candidates; the second scores only those exactly
// from the float32 vectors. The estimate ranks like the exact score
// (the query's dot product with the mean is the same for every vector),
// so the exact best k are among the candidates with a recall that
// TestQuantizedRecall measures (1.0 on clustered data at 128k vectors
// and 2048 candidates, 0.999 on isotropic noise, the hard case).
//
// A set of at least 2*signFactor times the candidates has a cheaper pass
// before: each vector's residual signs, packed 64 dimensions to a word
// in an array of their own, are compared with the query's signs by a
// popcount per word, and only the signFactor times the candidates whose
// signs agree most (a histogram of the counts gives the cut) are
// estimated from their codes. At 128,637 vectors of 64 dimensions that
// is one word a vector read twice and a quarter of the table lookups;
// BenchmarkNearestTurns measures it against the codes alone.

// quantMin is the set size from which the two passes are used; below it
// the exact scan is cheap enough.
const quantMin = 16384

// candidates is how many vectors the first pass keeps for k wanted.
func candidates(k int) int { return max(2048, 16*k) }

// levels are the reconstruction values of the four codes, in units of a
// vector's residual RMS; thresholds are the boundaries between them.
var levels = [4]float32{-1.510, -0.4528, 0.4528, 1.510}

const threshold = 0.9816

// quant is the coded form of a vecSet.
type quant struct {
	words int       // uint64 per vector: ceil(dim/32)
	mean  []float32 // dim
	codes []uint64  // words per vector; dimension d is bits 2(d%32).. of word d/32
	scale []float32 // per vector: the residual's RMS
	sw    int       // uint64 per vector of signs: ceil(dim/64)
	signs []uint64  // sw per vector; bit d%64 of word d/64 is set if the residual's dimension d is >= 0
}

// buildQuant codes the n vectors of dim in vecs (normalized).
func buildQuant(vecs []float32, dim int) *quant {
	n := len(vecs) / dim
	qt := &quant{words: (dim + 31) / 32, sw: (dim + 63) / 64, mean: make([]float32, dim)}
	sum := make([]float64, dim)
	for i := range n {
		for d, f := range vecs[i*dim : (i+1)*dim] {
			sum[d] += float64(f)
		}
	}
	for d := range sum {
		qt.mean[d] = float32(sum[d] / float64(n))
	}
	qt.codes = make([]uint64, 0, n*qt.words)
	qt.scale = make([]float32, 0, n)
	qt.signs = make([]uint64, 0, n*qt.sw)
	for i := range n {
		qt.add(vecs[i*dim : (i+1)*dim])
	}
	return qt
}

// add appends the code of v (normalized, of the set's dimension).
func (qt *quant) add(v []float32) {
	var s2 float64
	for d, f := range v {
		r := float64(f - qt.mean[d])
		s2 += r * r
	}
	rms := float32(math.Sqrt(s2 / float64(len(v))))
	qt.scale = append(qt.scale, rms)
	start, sstart := len(qt.codes), len(qt.signs)
	qt.codes = append(qt.codes, make([]uint64, qt.words)...)
	qt.signs = append(qt.signs, make([]uint64, qt.sw)...)
	if rms == 0 {
		return
	}
	inv := 1 / rms
	for d, f := range v {
		z := (f - qt.mean[d]) * inv
		var c uint64
		switch {
		case z < -threshold:
			c = 0
		case z < 0:
			c = 1
		case z < threshold:
			c = 2
		default:
			c = 3
		}
		qt.codes[start+d/32] |= c << (2 * (d % 32))
		qt.signs[sstart+d/64] |= (c >> 1) << (d % 64)
	}
}

// set replaces the code of vector i by v's.
func (qt *quant) set(i int, v []float32) {
	n := len(qt.scale)
	qt.add(v)
	qt.move(i, n)
	qt.truncate(n)
}

// move copies the code of vector j over vector i's.
func (qt *quant) move(i, j int) {
	w, sw := qt.words, qt.sw
	copy(qt.codes[i*w:(i+1)*w], qt.codes[j*w:(j+1)*w])
	copy(qt.signs[i*sw:(i+1)*sw], qt.signs[j*sw:(j+1)*sw])
	qt.scale[i] = qt.scale[j]
}

// truncate keeps the codes of the first n vectors.
func (qt *quant) truncate(n int) {
	qt.codes, qt.scale, qt.signs = qt.codes[:n*qt.words], qt.scale[:n], qt.signs[:n*qt.sw]
}

// tables returns the first pass's lookup tables for q: for each byte of a
// code (four dimensions), the query's dot product with every value the
// byte can take.
func (qt *quant) tables(q []float32) [][256]float32 {
	t := make([][256]float32, qt.words*8)
	for p := range t {
		var w [4]float32 // q of the byte's four dimensions (0 past dim)
		for k := range 4 {
			if d := 4*p + k; d < len(q) {
				w[k] = q[d]
			}
		}
		for v := range 256 {
			t[p][v] = w[0]*levels[v&3] + w[1]*levels[v>>2&3] + w[2]*levels[v>>4&3] + w[3]*levels[v>>6&3]
		}
	}
	return t
}

// estimate keeps in h the h.k vectors of [from, to) with the best
// estimate.
func (qt *quant) estimate(t [][256]float32, from, to int, h *topK[int32]) {
	w := qt.words
	tp := make([]*[8][256]float32, w)
	for j := range tp {
		tp[j] = (*[8][256]float32)(t[j*8:])
	}
	codes, scale := qt.codes[from*w:to*w], qt.scale[from:to]
	floor := float32(math.Inf(-1)) // the worst kept, once h is full
	for i, sc := range scale {
		c := codes[i*w : (i+1)*w]
		var s0, s1 float32
		for j, x := range c {
			b := tp[j]
			s0 += b[0][uint8(x)] + b[1][uint8(x>>8)] + b[2][uint8(x>>16)] + b[3][uint8(x>>24)]
			s1 += b[4][uint8(x>>32)] + b[5][uint8(x>>40)] + b[6][uint8(x>>48)] + b[7][uint8(x>>56)]
		}
		if s := (s0 + s1) * sc; s > floor {
			h.push(int32(from+i), s)
			if h.full() {
				floor = h.a[0].sim
			}
		}
	}
}

// signFactor is how many times the coded pass's candidates the sign
// pass keeps: the vectors whose residual's signs agree most with the
// query's.
const signFactor = 16

// querySigns packs the signs of q as the set's signs are packed.
func (qt *quant) querySigns(q []float32) []uint64 {
	s := make([]uint64, qt.sw)
	for d, f := range q {
		if f >= 0 {
			s[d/64] |= 1 << (d % 64)
		}
	}
	return s
}

// disagree counts, in hist, the vectors of [from, to) by how many of
// their residual's signs differ from qs.
func (qt *quant) disagree(qs []uint64, from, to int, hist []int32) {
	sw := qt.sw
	if sw == 1 {
		q := qs[0]
		for _, x := range qt.signs[from:to] {
			hist[bits.OnesCount64(x^q)]++
		}
		return
	}
	signs := qt.signs[from*sw : to*sw]
	for i := 0; i < len(signs); i += sw {
		d := 0
		for j, x := range signs[i : i+sw] {
			d += bits.OnesCount64(x ^ qs[j])
		}
		hist[d]++
	}
}

// estimateNear appends to out the estimate of every vector of [from,
// to) whose signs differ from qs in at most most places.
func (qt *quant) estimateNear(t [][256]float32, qs []uint64, most, from, to int, out []scored[int32]) []scored[int32] {
	w, sw := qt.words, qt.sw
	tp := make([]*[8][256]float32, w)
	for j := range tp {
		tp[j] = (*[8][256]float32)(t[j*8:])
	}
	var idx [1024]int32 // the vectors of a block that pass, first found then estimated
	for base := from; base < to; base += len(idx) {
		end, n := min(base+len(idx), to), 0
		if sw == 1 {
			q := qs[0]
			for i, x := range qt.signs[base:end] {
				idx[n] = int32(base + i)
				if bits.OnesCount64(x^q) <= most {
					n++
				}
			}
		} else {
			for i := base; i < end; i++ {
				d := 0
				for j, x := range qt.signs[i*sw : (i+1)*sw] {
					d += bits.OnesCount64(x ^ qs[j])
				}
				idx[n] = int32(i)
				if d <= most {
					n++
				}
			}
		}
		for _, i := range idx[:n] {
			var s0, s1 float32
			for j, x := range qt.codes[int(i)*w : int(i+1)*w] {
				b := tp[j]
				s0 += b[0][uint8(x)] + b[1][uint8(x>>8)] + b[2][uint8(x>>16)] + b[3][uint8(x>>24)]
				s1 += b[4][uint8(x>>32)] + b[5][uint8(x>>40)] + b[6][uint8(x>>48)] + b[7][uint8(x>>56)]
			}
			out = append(out, scored[int32]{i, (s0 + s1) * qt.scale[i]})
		}
	}
	return out
}

// selectBest reorders a so that its r best (highest sim) come first, in
// no order, and returns them (Hoare's quickselect).
func selectBest(a []scored[int32], r int) []scored[int32] {
	if r >= len(a) {
		return a
	}
	lo, hi := 0, len(a)-1
	for lo < hi {
		p := a[lo+(hi-lo)/2].sim
		i, j := lo, hi
		for i <= j {
			for a[i].sim > p {
				i++
			}
			for a[j].sim < p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case r-1 <= j:
			hi = j
		case r-1 >= i:
			lo = i
		default:
			return a[:r]
		}
	}
	return a[:r]
}

// nearestQuant adds the h.k vectors of v most similar to q to h, by the
// passes over the codes; v.q is built.
func (v *vecSet) nearestQuant(q []float32, h *topK[int64]) {
	n := len(v.ids)
	r := candidates(h.k)
	t := v.q.tables(q)
	parts := max(min(runtime.GOMAXPROCS(0), 4, n/quantMin), 1)
	hs := make([]*topK[int32], parts)
	for p := range hs {
		hs[p] = newTopK[int32](r)
	}
	per := (n + parts - 1) / parts
	run := func(f func(p, from, to int)) {
		if parts == 1 {
			f(0, 0, n)
			return
		}
		var wg sync.WaitGroup
		for p := range parts {
			wg.Go(func() { f(p, p*per, min((p+1)*per, n)) })
		}
		wg.Wait()
	}
	if v.q.signs == nil || n < 2*signFactor*r {
		run(func(p, from, to int) { v.q.estimate(t, from, to, hs[p]) })
	} else {
		qs := v.q.querySigns(q)
		hists := make([][]int32, parts)
		run(func(p, from, to int) {
			hists[p] = make([]int32, 64*v.q.sw+1)
			v.q.disagree(qs, from, to, hists[p])
		})
		most, kept := 0, 0
		for ; most < len(hists[0]); most++ {
			for _, hp := range hists {
				kept += int(hp[most])
			}
			if kept >= signFactor*r {
				break
			}
		}
		outs := make([][]scored[int32], parts)
		run(func(p, from, to int) {
			outs[p] = v.q.estimateNear(t, qs, most, from, to, make([]scored[int32], 0, kept/parts+kept/8))
		})
		all := outs[0]
		for _, o := range outs[1:] {
			all = append(all, o...)
		}
		for _, c := range selectBest(all, r) {
			i := int(c.id)
			h.push(v.ids[i], dot(v.vecs[i*v.dim:(i+1)*v.dim], q))
		}
		return
	}
	for _, ph := range hs {
		for _, c := range ph.a {
			i := int(c.id)
			h.push(v.ids[i], dot(v.vecs[i*v.dim:(i+1)*v.dim], q))
		}
	}
}
