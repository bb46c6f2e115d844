package models

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
)

// providerTimeout bounds asking a provider for its models, so that a
// provider that hangs does not hold up models.list or env.describe.
const providerTimeout = 3 * time.Second

// What to do about the local provider: it did not answer, or it has no
// models.
const (
	hintUnreachable = "start Ollama (`ollama serve`), or point keel at it with OLLAMA_HOST / --ollama-host; without it keel still runs tools directly (`keel tools call`)"
	hintNoModels    = "no models yet: pull one, e.g. `keel models pull qwen2.5:0.5b`"
)

// ServiceConfig is what a Service serves from. Router and Providers are
// required; the zero value of the rest is safe.
type ServiceConfig struct {
	// Router is the model layer models.chat calls through.
	Router *Router
	// Providers is every configured provider by name, the local one
	// included (as the router has them).
	Providers map[string]ProviderConfig
	// Local names the local provider in Providers, the one that pulls
	// models (when it is a Puller) and whose hints say how to start it.
	Local string
	// Endpoint is where the local provider is reached; empty when it
	// does not say. Other providers say with a BaseURL method.
	Endpoint string
	// File is the models configuration, named in the hints about
	// providers declared there.
	File string
	// Interceptors see every models.chat call (a direct call: its
	// invocation names no run), as engine.Config.ModelInterceptors see a
	// run's; a denied call reaches no model. Default none.
	Interceptors intercept.Models
}

// Puller is a provider that can download models (ollama.Provider).
type Puller interface {
	// Pull downloads the model name, calling progress (which may be nil)
	// from the calling goroutine, in order, with each report.
	Pull(ctx context.Context, name string, progress func(keel.PullProgress)) error
}

// Service serves the model methods of the protocol (models.list,
// models.pull, models.chat; ipc.Models and ipc.Chat) from the model
// layer. It is safe for concurrent use.
type Service struct {
	cfg ServiceConfig
}

// NewService returns a Service over cfg.
func NewService(cfg ServiceConfig) *Service { return &Service{cfg: cfg} }

// askProvider asks p, configured under name, for its models, for at most
// providerTimeout. hint says what to do when that fails or finds none.
func (s *Service) askProvider(ctx context.Context, name string, p Provider) (list []ModelInfo, hint string, err error) {
	ctx, cancel := context.WithTimeout(ctx, providerTimeout)
	defer cancel()
	list, err = p.Models(ctx)
	local := name == s.cfg.Local
	switch {
	case err != nil && local:
		return nil, hintUnreachable, err
	case err != nil:
		return nil, fmt.Sprintf("check provider %s in %s: that its server runs at base_url and its API key is set (see docs/models.md)", name, s.cfg.File), err
	case len(list) == 0 && local:
		return nil, hintNoModels, nil
	case len(list) == 0:
		return nil, fmt.Sprintf("declare the models of provider %s in %s, or set discover (see docs/models.md)", name, s.cfg.File), nil
	}
	return list, "", nil
}

// endpointOf returns where the provider configured as name is reached,
// when it says.
func (s *Service) endpointOf(name string) string {
	if name == s.cfg.Local {
		return s.cfg.Endpoint
	}
	if bu, ok := s.cfg.Providers[name].Provider.(interface{ BaseURL() string }); ok {
		return bu.BaseURL()
	}
	return ""
}

// capNames spells capabilities as the protocol does.
func capNames(caps []Capability) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = string(c)
	}
	return out
}

// ListModels asks every configured provider for its models, all at once,
// and lists them under the names routing uses: local providers first,
// then by name. A provider that fails is reported in the list, not as an
// error.
func (s *Service) ListModels(ctx context.Context) (keel.ModelList, error) {
	providers := s.cfg.Providers
	names := slices.Collect(maps.Keys(providers))
	slices.SortFunc(names, func(x, y string) int {
		if cx, cy := providers[x].Cloud, providers[y].Cloud; cx != cy {
			if cx {
				return 1
			}
			return -1
		}
		return strings.Compare(x, y)
	})
	type answer struct {
		list []ModelInfo
		hint string
		err  error
	}
	answers := make([]answer, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			a := &answers[i]
			a.list, a.hint, a.err = s.askProvider(ctx, name, providers[name].Provider)
		})
	}
	wg.Wait()

	var res keel.ModelList
	for i, name := range names {
		a := answers[i]
		ps := keel.ProviderStatus{Name: name, Endpoint: s.endpointOf(name), Reachable: a.err == nil, Hint: a.hint}
		if a.err != nil {
			ps.Error = a.err.Error()
		}
		res.Providers = append(res.Providers, ps)
		for _, m := range a.list {
			res.Models = append(res.Models, keel.ModelInfo{Name: m.Name, Provider: name, Capabilities: capNames(m.Capabilities),
				ContextLength: m.ContextLength, Size: m.Size, Family: m.Family})
		}
	}
	return res, nil
}

// PullModel pulls a model through the local provider, passing its
// progress on. Errors: a local provider that is not a Puller, or a pull
// cut short by ctx, wraps keel.ErrUnavailable; a name the provider
// refuses or the registry does not know keel.ErrInvalid; a provider or
// registry out of reach keel.ErrModelUnavailable.
func (s *Service) PullModel(ctx context.Context, name string, progress func(keel.PullProgress)) error {
	local := s.cfg.Providers[s.cfg.Local].Provider
	pl, ok := local.(Puller)
	if !ok {
		return fmt.Errorf("model provider %s cannot pull models: %w", local.Name(), keel.ErrUnavailable)
	}
	err := pl.Pull(ctx, name, progress)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("pull of %s cancelled: %w", name, keel.ErrUnavailable)
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrModelNotFound):
		return fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	}
	return fmt.Errorf("%w: %w", keel.ErrModelUnavailable, err)
}

// Chat serves models.chat: one call through the router, streamed to
// onDelta (which may be nil); with a format, a structured call with
// repairs. Errors: no messages, or a message of an unknown role, wraps
// keel.ErrInvalid, as do failures of the request itself (KindOf
// invalid request, context too long, policy, budget, invalid output);
// a provider that fails otherwise wraps keel.ErrModelUnavailable.
func (s *Service) Chat(ctx context.Context, p keel.ChatRequest, onDelta func(keel.ChatDelta)) (keel.ChatReply, error) {
	if len(p.Messages) == 0 {
		return keel.ChatReply{}, fmt.Errorf("messages is empty: %w", keel.ErrInvalid)
	}
	req := ChatRequest{
		Model: p.Model, Tools: p.Tools, MaxTokens: p.MaxTokens, Temperature: p.Temperature, Seed: p.Seed,
		AllowCloud: p.AllowCloud, Private: p.Private,
	}
	for _, m := range p.Messages {
		switch Role(m.Role) {
		case RoleSystem, RoleUser, RoleAssistant, RoleTool:
		default:
			return keel.ChatReply{}, fmt.Errorf("message role %q: want system, user, assistant or tool: %w", m.Role, keel.ErrInvalid)
		}
		req.Messages = append(req.Messages, Message{Role: Role(m.Role), Content: m.Content, ToolCalls: m.ToolCalls,
			ToolCallID: m.ToolCallID, Images: m.Images, Private: m.Private})
	}
	var (
		resp     ChatResponse
		attempts int
		err      error
	)
	call := func(ctx context.Context) intercept.ModelOutcome {
		resp, attempts, err = s.chat(ctx, req, p, onDelta)
		return intercept.ModelOutcome{Model: resp.Model, Provider: resp.Meta.Provider, PromptTokens: resp.Usage.PromptTokens,
			CompletionTokens: resp.Usage.CompletionTokens, CostUSD: resp.Meta.CostUSD, FinishReason: resp.FinishReason, Err: err}
	}
	if len(s.cfg.Interceptors) == 0 {
		call(ctx)
	} else if o := s.cfg.Interceptors.Call(ctx, keel.ModelInvocation{Model: p.Model}, call); err == nil && o.Err != nil {
		err = o.Err // denied: the call did not run
	}
	if err != nil {
		return keel.ChatReply{}, serviceError(err)
	}
	m := resp.Meta
	return keel.ChatReply{
		Model: resp.Model, Provider: m.Provider, FinishReason: resp.FinishReason,
		Message:      keel.ChatMessage{Role: string(RoleAssistant), Content: resp.Message.Content, ToolCalls: resp.Message.ToolCalls},
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens,
		CostUSD: m.CostUSD, TTFTMS: millis(m.FirstByte), LatencyMS: millis(m.Latency),
		Retries: m.Retries, Route: m.Route, Variant: m.Variant, Attempts: attempts,
	}, nil
}

// chat sends req through the router: structured when p asks for a
// format (repairing invalid output), else streamed to onDelta. attempts
// counts a structured call's tries.
func (s *Service) chat(ctx context.Context, req ChatRequest, p keel.ChatRequest, onDelta func(keel.ChatDelta)) (ChatResponse, int, error) {
	if len(p.Format) > 0 {
		res, err := Structured(ctx, s.cfg.Router, req, p.Format, p.Repairs)
		return res.Response, len(res.Attempts), err
	}
	var stream func(Delta)
	if onDelta != nil {
		stream = func(d Delta) {
			if d.Content != "" {
				onDelta(keel.ChatDelta{Content: d.Content, Restart: d.Restart})
			}
		}
	}
	resp, err := s.cfg.Router.Chat(ctx, req, stream)
	return resp, 0, err
}

// millis expresses d in milliseconds, as the protocol does.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// serviceError maps a model-layer failure onto the errors of the root
// package the protocol layer knows, keeping the classified message.
func serviceError(err error) error {
	switch KindOf(err) {
	case KindInvalidRequest, KindContextTooLong, KindPolicy, KindBudget, KindInvalidOutput:
		return fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	case KindCancelled:
		return err
	}
	if errors.Is(err, keel.ErrInvalid) {
		return err
	}
	if errors.Is(err, intercept.ErrDenied) { // refused like a policy error
		return fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	}
	return fmt.Errorf("%w: %w", keel.ErrModelUnavailable, err)
}
