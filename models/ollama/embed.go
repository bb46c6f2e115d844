package ollama

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel/models"
)

var _ models.Embedder = (*Provider)(nil)

// Embed returns one embedding per input, each of length 1 (cosine
// ready), as Ollama's /api/embed returns them. Inputs longer than the
// model's context are refused by Ollama rather than truncated.
//
// Several inputs go to /api/embed in one request. A single input (a
// search's query) goes to the older /api/embeddings, and Embed
// normalizes its vector: the runner computes the same vector for both,
// but /api/embed also reads the model file's metadata on every call (for
// truncation, which keel does not ask for) and looks the model's name up
// twice, about 1 ms of a ~10 ms query embedding with a tiny model on a
// 2-core machine (Ollama v0.17.4, server/routes.go), more with a large
// vocabulary. /api/embeddings does not report the prompt's token count,
// so Usage is zero then. An Ollama without /api/embeddings (404 for the
// path, not for the model) is asked through /api/embed from then on.
func (p *Provider) Embed(ctx context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	if len(req.Input) == 0 {
		return models.EmbedResponse{Model: req.Model}, nil
	}
	var opts map[string]any
	if p.numThread > 0 {
		opts = map[string]any{"num_thread": p.numThread}
	}
	keepAlive := &api.Duration{Duration: p.keepAlive}
	if len(req.Input) == 1 && req.Input[0] != "" && !p.noLegacyEmbed.Load() {
		resp, err := p.client.Embeddings(ctx, &api.EmbeddingRequest{Model: req.Model, Prompt: req.Input[0], KeepAlive: keepAlive, Options: opts})
		switch {
		case err == nil && len(resp.Embedding) > 0:
			return models.EmbedResponse{Model: req.Model, Vectors: [][]float32{normalized(resp.Embedding)}}, nil
		case err == nil:
			return models.EmbedResponse{}, &models.Error{Kind: models.KindInvalidRequest, Provider: "ollama", Model: req.Model,
				Msg: "Ollama returned an empty embedding"}
		case !noRoute(err):
			return models.EmbedResponse{}, p.wrap(ctx, "embed", req.Model, err)
		}
		p.noLegacyEmbed.Store(true)
	}
	truncate := false
	ereq := &api.EmbedRequest{
		Model:     req.Model,
		Input:     req.Input,
		Truncate:  &truncate,
		KeepAlive: keepAlive,
		Options:   opts,
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

// noRoute reports whether err is the HTTP server's 404 for a path it
// does not serve (Ollama's router answers "404 page not found"), not
// Ollama's 404 for a model it does not have ("model 'x' not found").
func noRoute(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && se.StatusCode == http.StatusNotFound && !strings.Contains(se.ErrorMessage, "model")
}

// normalized returns v as float32, scaled to length 1 as /api/embed
// scales its vectors (the sum of squares taken in float64 here, in
// float32 there: the two agree to about 1e-7); a zero vector stays zero.
func normalized(v []float64) []float32 {
	var sum float64
	for _, f := range v {
		sum += f * f
	}
	out := make([]float32, len(v))
	scale := 1.0
	if sum > 0 {
		scale = 1 / math.Sqrt(sum)
	}
	for i, f := range v {
		out[i] = float32(f * scale)
	}
	return out
}
