package ollama

import (
	"context"
	"fmt"

	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel/models"
)

var _ models.Embedder = (*Provider)(nil)

// Embed returns one embedding per input through /api/embed. Inputs longer
// than the model's context are refused by Ollama rather than truncated.
func (p *Provider) Embed(ctx context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	if len(req.Input) == 0 {
		return models.EmbedResponse{Model: req.Model}, nil
	}
	truncate := false
	ereq := &api.EmbedRequest{
		Model:     req.Model,
		Input:     req.Input,
		Truncate:  &truncate,
		KeepAlive: &api.Duration{Duration: p.keepAlive},
	}
	if p.numThread > 0 {
		ereq.Options = map[string]any{"num_thread": p.numThread}
	}
	resp, err := p.client.Embed(ctx, ereq)
	if err != nil {
		return models.EmbedResponse{}, p.wrap(ctx, "embed", req.Model, err)
	}
	if len(resp.Embeddings) != len(req.Input) {
		return models.EmbedResponse{}, &models.Error{Kind: models.KindInvalidRequest, Provider: "ollama", Model: req.Model,
			Msg: fmt.Sprintf("Ollama returned %d embeddings for %d inputs", len(resp.Embeddings), len(req.Input))}
	}
	return models.EmbedResponse{Model: req.Model, Vectors: resp.Embeddings, Usage: models.Usage{PromptTokens: resp.PromptEvalCount}}, nil
}
