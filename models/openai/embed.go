package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// Embed returns a vector per input from POST /embeddings, bounded by
// Config.Timeout. The model must be declared (or discovered); errors are
// classified like Chat's.
func (p *Provider) Embed(ctx context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	if err := ctx.Err(); err != nil {
		return models.EmbedResponse{}, p.ctxError(req.Model, err)
	}
	if err := p.serves(ctx, req.Model); err != nil {
		return models.EmbedResponse{}, err
	}
	if len(req.Input) == 0 {
		return models.EmbedResponse{}, p.errorf(models.KindInvalidRequest, req.Model, nil, "no input to embed")
	}
	key, err := p.keys.key(ctx, p, req.Model)
	if err != nil {
		return models.EmbedResponse{}, err
	}
	start := time.Now()
	resp, err := p.embed(ctx, key, req)
	attrs := []slog.Attr{slog.String(logkey.Provider, p.name), slog.String(logkey.Model, req.Model),
		slog.Int(logkey.Inputs, len(req.Input)), slog.Duration(logkey.Duration, time.Since(start))}
	if err != nil {
		attrs = append(attrs, slog.String(logkey.ErrKind, string(models.KindOf(err))), slog.String(logkey.Err, err.Error()))
		p.log.LogAttrs(ctx, slog.LevelDebug, "openai embed failed", attrs...)
		return models.EmbedResponse{}, err
	}
	p.log.LogAttrs(ctx, slog.LevelDebug, "openai embed", append(attrs, slog.Int(logkey.PromptTokens, resp.Usage.PromptTokens))...)
	return resp, nil
}

func (p *Provider) embed(ctx context.Context, key string, req models.EmbedRequest) (models.EmbedResponse, error) {
	tctx, cancel := p.withTimeout(ctx)
	defer cancel()
	var (
		res  *http.Response
		body []byte
		er   openai.CreateEmbeddingResponse
	)
	_, err := p.embedSvc.New(tctx, openai.EmbeddingNewParams{
		Model:          openai.EmbeddingModel(req.Model),
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: req.Input},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
	}, p.callOptions(key, &res, &body)...)
	if err != nil {
		return models.EmbedResponse{}, p.classify(ctx, tctx, req.Model, key, res, err)
	}
	if err := json.Unmarshal(body, &er); err != nil {
		return models.EmbedResponse{}, p.invalidReply(req.Model, err)
	}
	vectors := make([][]float32, len(req.Input))
	for _, e := range er.Data {
		if e.Index < 0 || int(e.Index) >= len(vectors) || vectors[e.Index] != nil {
			return models.EmbedResponse{}, p.invalidReply(req.Model, fmt.Errorf("embedding index %d out of range or repeated", e.Index))
		}
		v := make([]float32, len(e.Embedding))
		for i, x := range e.Embedding {
			v[i] = float32(x)
		}
		vectors[e.Index] = v
	}
	for i, v := range vectors {
		if v == nil {
			return models.EmbedResponse{}, p.invalidReply(req.Model, fmt.Errorf("no embedding for input %d", i))
		}
	}
	return models.EmbedResponse{
		Model:   req.Model,
		Vectors: vectors,
		Usage:   models.Usage{PromptTokens: int(er.Usage.PromptTokens)},
	}, nil
}
