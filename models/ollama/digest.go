package ollama

import (
	"context"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
)

// digestEntry is a model's digest as /api/tags listed it, kept until
// expires; "" when the list did not have the model.
type digestEntry struct {
	digest  string
	expires time.Time
}

// digest returns the digest of model name (the hex sha256 of its
// manifest, as /api/tags lists it), which changes whenever the model
// does (pulled again, re-created). It is reused for showTTL and dropped
// when the model is pulled (forgetShow), so a changed model shows in
// the traces within that time. "" when Ollama cannot say: a failed
// list is not the call's failure, and is not asked again before
// showTTL.
func (p *Provider) digest(ctx context.Context, name string) string {
	now := p.now()
	p.mu.Lock()
	e, ok := p.digests[modelKey(name)]
	p.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.digest
	}
	list, err := p.client.List(ctx)
	if err != nil {
		p.mu.Lock()
		p.noteDigest(name, "", now)
		p.mu.Unlock()
		return ""
	}
	p.noteDigests(list, now)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.digests[modelKey(name)]; !ok {
		p.noteDigest(name, "", now) // not listed: no digest to give
	}
	return p.digests[modelKey(name)].digest
}

// noteDigests keeps the digests of list, listed at now.
func (p *Provider) noteDigests(list *api.ListResponse, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range list.Models {
		p.noteDigest(m.Name, m.Digest, now)
	}
}

// noteDigest keeps one digest. p.mu must be held.
func (p *Provider) noteDigest(name, digest string, now time.Time) {
	if p.digests == nil {
		p.digests = map[string]digestEntry{}
	}
	for k, e := range p.digests {
		if !now.Before(e.expires) {
			delete(p.digests, k)
		}
	}
	p.digests[modelKey(name)] = digestEntry{digest: digest, expires: now.Add(showTTL)}
}

// modelKey is how the digest cache names a model: without the implicit
// ":latest" tag, which Ollama lists and callers may omit.
func modelKey(name string) string { return strings.TrimSuffix(name, ":latest") }

// Digest returns the digest of model name (see digest): the hex sha256
// of its manifest as /api/tags lists it, "" when Ollama does not list
// it or cannot be asked. It is the source of knowledge.Options.ModelDigest,
// so that vectors of a changed model are re-embedded. The error is
// always nil; the signature is that of the option.
func (p *Provider) Digest(ctx context.Context, name string) (string, error) {
	return p.digest(ctx, name), nil
}
