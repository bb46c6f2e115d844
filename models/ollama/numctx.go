package ollama

// minReply is the fewest tokens a prompt must leave free for the reply.
const minReply = 64

// numCtx returns the num_ctx to send for a call of model that needs need
// tokens: the smallest power of two from 2048 that holds it, capped at the
// model's context length, and never below what was sent for the model
// before. A different num_ctx makes Ollama reload the model, so the size
// only grows (at most a handful of reloads per model) instead of changing
// with every request.
func (p *Provider) numCtx(model string, need, limit int) int {
	n := 2048
	for n < need {
		n *= 2
	}
	n = min(n, limit)
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev := p.ctxSize[model]; prev > n {
		n = prev
	}
	p.ctxSize[model] = n
	return n
}
