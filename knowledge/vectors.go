package knowledge

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/keel-runtime/keel/models"
)

// Vector search is exact: a scope's vectors (of the current model and
// digest) are held in memory, normalized, in one flat []float32, and a
// query is a dot product with each. See doc.go for the figures that chose
// it.

// vecSet is the vectors of one scope for one model. A search holds mu
// for reading; an update applied in place (vectorCache.update) for
// writing.
type vecSet struct {
	model, digest string
	dim           int

	mu   sync.RWMutex
	ids  []int64
	vecs []float32       // len(ids)*dim, each normalized
	q    *quant          // the codes of a large set (quantMin), else nil
	pos  map[int64]int32 // index of each id; built by the first update
}

// vectorCache holds a vecSet per scope, loaded on the first vector search.
// Writes that add vectors or delete chunks with vectors update a loaded
// set in place (update); a scope's documents forgotten, or vectors
// written across scopes, drop it (invalidate), to be loaded again.
type vectorCache struct {
	mu   sync.Mutex
	sets map[Scope]*vecSet
	gen  map[Scope]uint64 // bumped by invalidate
	all  uint64           // bumped by invalidateAll
}

func (c *vectorCache) invalidate(s Scope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == nil {
		c.gen = map[Scope]uint64{}
	}
	c.gen[s]++
	delete(c.sets, s)
}

func (c *vectorCache) invalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == nil {
		c.gen = map[Scope]uint64{}
	}
	for s := range c.sets {
		c.gen[s]++
	}
	c.all++
	c.sets = nil
}

// update applies a committed write to the cached set of s, if loaded and
// of model and digest: the vectors of the chunks gone are removed, those
// of ids added (or replaced). Any load of s in flight is discarded (its
// rows may predate the write). Applying a write the set already holds
// (loaded after the commit) changes nothing.
func (c *vectorCache) update(s Scope, model, digest string, gone, ids []int64, vecs [][]float32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == nil {
		c.gen = map[Scope]uint64{}
	}
	c.gen[s]++
	v := c.sets[s]
	if v == nil {
		return
	}
	if v.model != model || v.digest != digest {
		if len(ids) > 0 { // vectors of another model: the set is stale
			delete(c.sets, s)
		}
		if len(gone) == 0 {
			return
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pos == nil {
		v.pos = make(map[int64]int32, len(v.ids))
		for i, id := range v.ids {
			v.pos[id] = int32(i)
		}
	}
	for _, id := range gone {
		i, ok := v.pos[id]
		if !ok {
			continue
		}
		// Move the last vector into i.
		last := int32(len(v.ids) - 1)
		if i != last {
			v.ids[i] = v.ids[last]
			copy(v.vecs[int(i)*v.dim:int(i+1)*v.dim], v.vecs[int(last)*v.dim:])
			v.pos[v.ids[i]] = i
			if v.q != nil {
				v.q.move(int(i), int(last))
			}
		}
		v.ids, v.vecs = v.ids[:last], v.vecs[:int(last)*v.dim]
		if v.q != nil {
			v.q.truncate(int(last))
		}
		delete(v.pos, id)
	}
	if v.model != model || v.digest != digest {
		return
	}
	for k, id := range ids {
		if len(vecs[k]) != v.dim {
			delete(c.sets, s) // another dimension: load again
			return
		}
		b := encodeVec(vecs[k])
		if i, ok := v.pos[id]; ok {
			normalizeInto(v.vecs[:int(i)*v.dim], b)
			if v.q != nil {
				v.q.set(int(i), v.vecs[int(i)*v.dim:int(i+1)*v.dim])
			}
			continue
		}
		v.pos[id] = int32(len(v.ids))
		v.ids = append(v.ids, id)
		v.vecs = normalizeInto(v.vecs, b)
		if v.q != nil {
			v.q.add(v.vecs[len(v.vecs)-v.dim:])
		}
	}
	if v.q == nil && len(v.ids) >= quantMin {
		v.q = buildQuant(v.vecs, v.dim)
	}
}

// get returns the cached set of s for model/digest, or the generation to
// pass to put after loading it.
func (c *vectorCache) get(s Scope, model, digest string) (*vecSet, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.sets[s]; v != nil && v.model == model && v.digest == digest {
		return v, 0
	}
	return nil, c.gen[s] + c.all<<32
}

// put caches v unless s was written since gen.
func (c *vectorCache) put(s Scope, gen uint64, v *vecSet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen[s]+c.all<<32 != gen {
		return
	}
	if c.sets == nil {
		c.sets = map[Scope]*vecSet{}
	}
	c.sets[s] = v
}

func encodeVec(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// normalizeInto appends b's vector, scaled to length 1, to dst.
func normalizeInto(dst []float32, b []byte) []float32 {
	n := len(b) / 4
	start := len(dst)
	var sum float64
	for i := range n {
		f := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		dst = append(dst, f)
		sum += float64(f) * float64(f)
	}
	if sum > 0 {
		inv := float32(1 / math.Sqrt(sum))
		for i := start; i < len(dst); i++ {
			dst[i] *= inv
		}
	}
	return dst
}

func (ix *Index) vectors(ctx context.Context, s Scope) (*vecSet, error) {
	model, digest := ix.o.EmbedModel, ix.currentDigest()
	if v, _ := ix.vecs.get(s, model, digest); v != nil {
		return v, nil
	}
	_, gen := ix.vecs.get(s, model, digest)
	rows, err := ix.r.QueryContext(ctx, `SELECT v.chunk_id, v.vec FROM kn_vectors v
		JOIN kn_chunks c ON c.id = v.chunk_id JOIN kn_docs d ON d.id = c.doc_id
		WHERE d.scope = ? AND v.model = ? AND v.digest = ?`, string(s), model, digest)
	if err != nil {
		return nil, fmt.Errorf("knowledge: vectors: %w", err)
	}
	defer rows.Close()
	v := &vecSet{model: model, digest: digest}
	for rows.Next() {
		var id int64
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			return nil, fmt.Errorf("knowledge: vectors: %w", err)
		}
		if v.dim == 0 {
			v.dim = len(b) / 4
		}
		if len(b) != 4*v.dim {
			continue // another dimension: not of this model after all
		}
		v.ids = append(v.ids, id)
		v.vecs = normalizeInto(v.vecs, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("knowledge: vectors: %w", err)
	}
	if len(v.ids) >= quantMin {
		v.q = buildQuant(v.vecs, v.dim)
	}
	ix.vecs.put(s, gen, v)
	return v, nil
}

// nearest adds the h.k vectors of v most similar to q (normalized) to h.
// A large set is searched by its codes first (quant.go); a smaller one
// is scanned exactly, in parts on several goroutines.
func (v *vecSet) nearest(q []float32, h *topK[int64]) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if len(q) != v.dim || len(v.ids) == 0 {
		return
	}
	if v.q != nil {
		v.nearestQuant(q, h)
		return
	}
	parts := min(runtime.GOMAXPROCS(0), 4, len(v.vecs)/parallelScan+1)
	if parts <= 1 {
		v.scan(q, h, 0, len(v.ids))
		return
	}
	hs := make([]*topK[int64], parts)
	var wg sync.WaitGroup
	per := (len(v.ids) + parts - 1) / parts
	for p := range parts {
		hs[p] = newTopK[int64](h.k)
		wg.Go(func() { v.scan(q, hs[p], p*per, min((p+1)*per, len(v.ids))) })
	}
	wg.Wait()
	for _, ph := range hs {
		for _, s := range ph.a {
			h.push(s.id, s.sim)
		}
	}
}

// parallelScan is how many floats a scan goroutine is given at least.
const parallelScan = 1 << 20

// scan adds the best h.k of vectors [from, to) to h.
func (v *vecSet) scan(q []float32, h *topK[int64], from, to int) {
	for i := from; i < to; i++ {
		h.push(v.ids[i], dot(v.vecs[i*v.dim:(i+1)*v.dim], q))
	}
}

// dot is the dot product of a and b (len(b) >= len(a)), four lanes at a
// time: the compiler does not vectorize, independent sums let the CPU
// overlap the multiplies.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return s0 + s1 + s2 + s3
}

// embedInput is what is embedded for a chunk: its heading and text, cut
// to max bytes.
func embedInput(heading, text string, max int) string {
	s := text
	if heading != "" {
		s = heading + "\n" + text
	}
	if len(s) > max {
		s = s[:max]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// searchVector returns the n chunks of scopes nearest to text's vector
// that pass f. When f names the scopes and nothing else, every vector
// searched passes, and the hits are bare (their chunk and rank only: the
// caller reads the few it returns). A filter with other conditions is
// applied to the 4n nearest, so a very selective filter may leave fewer
// than n.
func (ix *Index) searchVector(ctx context.Context, text string, scopes []Scope, f filter, n int) ([]Hit, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	resp, err := ix.o.Embedder.Embed(ctx, models.EmbedRequest{Model: ix.o.EmbedModel, Input: []string{embedInput("", text, ix.o.EmbedMaxBytes)}})
	if err != nil {
		return nil, fmt.Errorf("knowledge: search: embed the query: %w", err)
	}
	if len(resp.Vectors) != 1 {
		return nil, fmt.Errorf("knowledge: search: embed the query: %d vectors for 1 input", len(resp.Vectors))
	}
	q := normalizeInto(nil, encodeVec(resp.Vectors[0]))
	k := n
	if !f.scopesOnly {
		k = n * 4
	}
	h := newTopK[int64](k)
	for _, s := range scopes {
		v, err := ix.vectors(ctx, s)
		if err != nil {
			return nil, err
		}
		v.nearest(q, h)
	}
	best := h.best()
	if len(best) == 0 {
		return nil, nil
	}
	if f.scopesOnly {
		out := make([]Hit, len(best))
		for i, b := range best {
			out[i] = Hit{row: b.id, Score: float64(b.sim), VectorRank: i + 1, bare: true}
		}
		return out, nil
	}
	ids := make([]byte, 0, 8*len(best))
	ids = append(ids, '[')
	for i, b := range best {
		if i > 0 {
			ids = append(ids, ',')
		}
		ids = strconv.AppendInt(ids, b.id, 10)
	}
	ids = append(ids, ']')
	rows, err := ix.query(ctx, `SELECT `+hitColumns+` FROM json_each(?) j
		CROSS JOIN kn_chunks c ON c.id = j.value CROSS JOIN kn_docs d ON d.id = c.doc_id
		WHERE `+f.where, append([]any{string(ids)}, f.args...)...)
	if err != nil {
		return nil, fmt.Errorf("knowledge: search: %w", err)
	}
	defer rows.Close()
	byID := make(map[string]Hit, len(best))
	for rows.Next() {
		h, err := scanHit(rows)
		if err != nil {
			return nil, fmt.Errorf("knowledge: search: %w", err)
		}
		byID[h.ChunkID] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("knowledge: search: %w", err)
	}
	var out []Hit
	for _, b := range best {
		h, ok := byID[chunkID(b.id)]
		if !ok {
			continue
		}
		h.Score = float64(b.sim)
		h.VectorRank = len(out) + 1
		out = append(out, h)
		if len(out) == n {
			break
		}
	}
	return out, nil
}

// pendingChunk is a chunk without a vector of the current model.
type pendingChunk struct {
	id            int64
	heading, text string
}

// Reembed embeds the chunks of scope ("" = every scope) that have no
// vector of the current model and digest (new chunks, or all of them
// after the model changed), replacing old vectors. progress, if set, is
// given the count done after each batch. It returns how many it embedded.
// Without an Embedder it does nothing.
func (ix *Index) Reembed(ctx context.Context, scope Scope, progress func(done int)) (int, error) {
	if ix.o.Embedder == nil {
		return 0, nil
	}
	return ix.embedPending(ctx, scope, progress)
}

func (ix *Index) embedPending(ctx context.Context, scope Scope, progress func(done int)) (int, error) {
	digest := ix.refreshDigest(ctx)
	model := ix.o.EmbedModel
	q := `SELECT c.id, c.heading, c.text FROM kn_chunks c JOIN kn_docs d ON d.id = c.doc_id
		LEFT JOIN kn_vectors v ON v.chunk_id = c.id
		WHERE (v.chunk_id IS NULL OR v.model != ? OR v.digest != ?)`
	args := []any{model, digest}
	if scope != "" {
		q += ` AND d.scope = ?`
		args = append(args, string(scope))
	}
	rows, err := ix.r.QueryContext(ctx, q+` ORDER BY c.id`, args...)
	if err != nil {
		return 0, fmt.Errorf("knowledge: embed: %w", err)
	}
	var pend []pendingChunk
	for rows.Next() {
		var p pendingChunk
		if err := rows.Scan(&p.id, &p.heading, &p.text); err != nil {
			rows.Close()
			return 0, fmt.Errorf("knowledge: embed: %w", err)
		}
		p.text = embedInput(p.heading, p.text, ix.o.EmbedMaxBytes)
		pend = append(pend, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("knowledge: embed: %w", err)
	}
	done := 0
	for len(pend) > 0 {
		b := pend[:min(len(pend), ix.o.EmbedBatch)]
		pend = pend[len(b):]
		in := make([]string, len(b))
		for i, p := range b {
			in[i] = p.text
		}
		resp, err := ix.o.Embedder.Embed(ctx, models.EmbedRequest{Model: model, Input: in})
		if err != nil {
			return done, fmt.Errorf("knowledge: embed: %w", err)
		}
		if len(resp.Vectors) != len(b) {
			return done, fmt.Errorf("knowledge: embed: %d vectors for %d inputs", len(resp.Vectors), len(b))
		}
		if err := ix.writeVectors(ctx, b, resp.Vectors, model, digest); err != nil {
			return done, err
		}
		if scope != "" {
			ids := make([]int64, len(b))
			for i, p := range b {
				ids[i] = p.id
			}
			ix.vecs.update(scope, model, digest, nil, ids, resp.Vectors)
		}
		done += len(b)
		if progress != nil {
			progress(done)
		}
	}
	if done > 0 && scope == "" {
		ix.vecs.invalidateAll()
	}
	return done, nil
}

// writeVectors stores one batch's vectors; a chunk deleted meanwhile is
// left out.
func (ix *Index) writeVectors(ctx context.Context, b []pendingChunk, vs [][]float32, model, digest string) error {
	tx, err := ix.begin(ctx)
	if err != nil {
		return fmt.Errorf("knowledge: embed: %w", err)
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO kn_vectors(chunk_id, model, digest, vec)
		SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM kn_chunks WHERE id = ?1)`)
	if err != nil {
		return fmt.Errorf("knowledge: embed: %w", err)
	}
	for i, p := range b {
		if _, err := st.ExecContext(ctx, p.id, model, digest, encodeVec(vs[i])); err != nil {
			return fmt.Errorf("knowledge: embed: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("knowledge: embed: %w", err)
	}
	return nil
}
