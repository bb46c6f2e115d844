package ollama

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// Defaults of Config.
const (
	DefaultHost        = "http://127.0.0.1:11434"
	DefaultKeepAlive   = 5 * time.Minute
	DefaultNumPredict  = 512
	DefaultCancelDrain = 10 * time.Second
)

// showTTL is how long a model's /api/show result is reused. The engine
// asks for capabilities on every run; a pulled or re-created model is
// seen within this delay.
const showTTL = 30 * time.Second

// Config configures a Provider. The zero value talks to a local Ollama.
type Config struct {
	// Host is Ollama's address, in OLLAMA_HOST syntax: "host:port",
	// "http://host:port" or "https://host". "" means the OLLAMA_HOST
	// environment variable, or DefaultHost when that is unset.
	Host string
	// HTTPClient sends the requests; nil means http.DefaultClient. Its
	// Timeout, if any, bounds whole streamed replies: prefer contexts.
	HTTPClient *http.Client
	// KeepAlive is how long Ollama keeps a model loaded after a call;
	// 0 means DefaultKeepAlive, negative means until Ollama stops.
	KeepAlive time.Duration
	// NumPredict caps generated tokens when a request's MaxTokens is 0;
	// 0 means DefaultNumPredict, negative means Ollama's own limit.
	NumPredict int
	// CancelDrain is how long the reply of a cancelled call is still
	// read, and discarded, in the background before the connection is
	// closed. Ollama v0.17.4 can hang for good when a client disconnects
	// mid-stream (its chat handler blocks sending a token nobody reads,
	// holding the model's only slot), so by default a cancelled call lets
	// Ollama finish the reply, at most num_predict tokens, and disconnects
	// only after CancelDrain. 0 means DefaultCancelDrain; negative
	// disconnects at once, which stops generation sooner but risks the
	// hang. Chat returns at once either way.
	CancelDrain time.Duration
	// NumThread is how many CPU threads Ollama computes a reply with
	// (its num_thread option, sent with every chat and embedding; Ollama
	// applies it when it loads the model, so a change reloads it). 0
	// leaves it to Ollama: the machine's physical cores. A small model on
	// a busy machine is much faster with 1: a runner with several threads
	// waits for all of them at every step of every token, and any one of
	// them kept off the CPU holds up the rest (24 tokens of a 260K model
	// under load: 15 s with 2 threads, 0.02 s with 1).
	NumThread int
	// Logger receives debug records of each call; nil discards.
	Logger *slog.Logger
}

// Provider is a models.Provider backed by an Ollama server. It is safe for
// concurrent use. Each Chat reads its reply on a goroutine of its own,
// which outlives a cancelled call for at most Config.CancelDrain; Close
// ends those goroutines and waits for them.
type Provider struct {
	base        *url.URL
	client      *api.Client
	keepAlive   time.Duration
	numPredict  int
	numThread   int
	cancelDrain time.Duration
	log         *slog.Logger
	now         func() time.Time

	life       context.Context // its cancel disconnects every reply
	disconnect context.CancelFunc
	readersMu  sync.Mutex // guards closed and readers.Add
	closed     bool
	readers    sync.WaitGroup

	// noLegacyEmbed: the server has no /api/embeddings (see Embed).
	noLegacyEmbed atomic.Bool

	mu      sync.Mutex
	shows   map[string]showEntry
	ctxSize map[string]int         // num_ctx last sent per model; see numCtx
	digests map[string]digestEntry // see digest

	// calib corrects the prompt estimate per model with the
	// prompt_eval_count Ollama reports.
	calib models.Calibration
}

type showEntry struct {
	info    models.ModelInfo
	expires time.Time
}

// New returns a Provider for the Ollama at cfg.Host. It does not contact
// the server; a bad address is the only error.
func New(cfg Config) (*Provider, error) {
	host := cfg.Host
	if host == "" {
		host = os.Getenv("OLLAMA_HOST")
	}
	base, err := parseHost(host)
	if err != nil {
		return nil, fmt.Errorf("ollama: %w", err)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	p := &Provider{
		base:        base,
		client:      api.NewClient(base, hc),
		keepAlive:   cfg.KeepAlive,
		numPredict:  cfg.NumPredict,
		numThread:   max(cfg.NumThread, 0),
		cancelDrain: cfg.CancelDrain,
		log:         cfg.Logger,
		now:         time.Now,
		shows:       make(map[string]showEntry),
		ctxSize:     make(map[string]int),
	}
	p.life, p.disconnect = context.WithCancel(context.Background())
	if p.keepAlive == 0 {
		p.keepAlive = DefaultKeepAlive
	}
	if p.numPredict == 0 {
		p.numPredict = DefaultNumPredict
	}
	if p.cancelDrain == 0 {
		p.cancelDrain = DefaultCancelDrain
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p, nil
}

// parseHost reads an address the way Ollama reads OLLAMA_HOST: the
// scheme defaults to http, the host to 127.0.0.1 and the port to 11434
// (80 or 443 when the scheme is given).
func parseHost(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		s = DefaultHost
	}
	scheme, rest, ok := strings.Cut(s, "://")
	port := "11434"
	switch {
	case !ok:
		scheme, rest = "http", s
	case scheme == "http":
		port = "80"
	case scheme == "https":
		port = "443"
	default:
		return nil, fmt.Errorf("host %q: scheme must be http or https", s)
	}
	hostport, path, _ := strings.Cut(rest, "/")
	host := hostport
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	}
	host = strings.Trim(host, "[]")
	if host == "" {
		host = "127.0.0.1"
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return nil, fmt.Errorf("host %q: bad port %q", s, port)
	}
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, port)}
	if path != "" {
		u.Path = "/" + path
	}
	return u, nil
}

// Close makes later calls to Chat fail with models.ErrUnavailable, lets
// the replies still streaming (drained ones and calls in flight) end for
// up to Config.CancelDrain, disconnects those that have not, and waits
// for their goroutines. Calls in flight then fail with
// models.ErrUnavailable. Close always returns nil and may be called more
// than once.
func (p *Provider) Close() error {
	p.readersMu.Lock()
	p.closed = true
	p.readersMu.Unlock()
	ended := make(chan struct{})
	go func() {
		p.readers.Wait()
		close(ended)
	}()
	if p.cancelDrain > 0 {
		t := time.NewTimer(p.cancelDrain)
		defer t.Stop()
		select {
		case <-ended:
		case <-t.C:
		}
	}
	p.disconnect()
	<-ended
	return nil
}

// Name returns "ollama".
func (p *Provider) Name() string { return "ollama" }

// Endpoint returns the base URL of the Ollama server, such as
// "http://127.0.0.1:11434".
func (p *Provider) Endpoint() string { return p.base.String() }

// Models lists the local models (/api/tags) with the capabilities and
// context length /api/show reports for each. Names drop the implicit
// ":latest" tag, so "llama3.2:latest" is listed as "llama3.2", the name
// people type and Ollama accepts. Show results are reused for 30s.
func (p *Provider) Models(ctx context.Context) ([]models.ModelInfo, error) {
	list, err := p.client.List(ctx)
	if err != nil {
		return nil, p.wrap(ctx, "list models", "", err)
	}
	p.noteDigests(list, p.now())
	out := make([]models.ModelInfo, 0, len(list.Models))
	for _, m := range list.Models {
		name := strings.TrimSuffix(m.Name, ":latest")
		info, err := p.Show(ctx, name)
		if errors.Is(err, models.ErrModelNotFound) {
			continue // deleted since it was listed
		}
		if err != nil {
			return nil, err
		}
		info.Size, info.Digest = m.Size, m.Digest
		out = append(out, info)
	}
	return out, nil
}

// Show describes the model name from /api/show: its capabilities (every
// completion model also gets CapStructured, since Ollama constrains output
// to a JSON Schema) and context length (the architecture's, or the
// model's num_ctx parameter when smaller). Results are reused for 30s.
// An unknown model gives an error wrapping models.ErrModelNotFound.
func (p *Provider) Show(ctx context.Context, name string) (models.ModelInfo, error) {
	if name == "" {
		return models.ModelInfo{}, fmt.Errorf("ollama show: no model named: %w", models.ErrInvalidRequest)
	}
	p.mu.Lock()
	e, ok := p.shows[name]
	p.mu.Unlock()
	if ok && p.now().Before(e.expires) {
		info := e.info
		info.Capabilities = slices.Clone(info.Capabilities)
		return info, nil
	}

	resp, err := p.client.Show(ctx, &api.ShowRequest{Model: name})
	if err != nil {
		return models.ModelInfo{}, p.wrap(ctx, "show", name, err)
	}
	info := modelInfo(name, resp)

	now := p.now()
	p.mu.Lock()
	for k, e := range p.shows {
		if !now.Before(e.expires) {
			delete(p.shows, k)
		}
	}
	cached := info
	cached.Capabilities = slices.Clone(info.Capabilities)
	p.shows[name] = showEntry{info: cached, expires: now.Add(showTTL)}
	p.mu.Unlock()
	return info, nil
}

// modelInfo maps an /api/show reply.
func modelInfo(name string, resp *api.ShowResponse) models.ModelInfo {
	info := models.ModelInfo{Name: name, Provider: "ollama", Family: resp.Details.Family}
	for _, c := range resp.Capabilities {
		switch string(c) {
		case "completion":
			info.Capabilities = append(info.Capabilities, models.CapCompletion)
		case "tools":
			info.Capabilities = append(info.Capabilities, models.CapTools)
		case "vision":
			info.Capabilities = append(info.Capabilities, models.CapVision)
		case "embedding":
			info.Capabilities = append(info.Capabilities, models.CapEmbedding)
		}
	}
	if info.Has(models.CapCompletion) {
		info.Capabilities = append(info.Capabilities, models.CapStructured)
	}

	if arch, ok := resp.ModelInfo["general.architecture"].(string); ok {
		info.ContextLength = asInt(resp.ModelInfo[arch+".context_length"])
	}
	// parameters is the Modelfile's PARAMETER lines: "num_ctx    2048\n...".
	for line := range strings.Lines(resp.Parameters) {
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != "num_ctx" {
			continue
		}
		if n, err := strconv.Atoi(f[1]); err == nil && n > 0 && (info.ContextLength == 0 || n < info.ContextLength) {
			info.ContextLength = n
		}
	}
	return info
}

func asInt(v any) int {
	switch n := v.(type) {
	case float64:
		return int(n)
	case int:
		return n
	case int64:
		return int(n)
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	}
	return 0
}

// toolMode is how a call offers tools to the model.
type toolMode string

const (
	toolsNone   toolMode = "none"   // no tools offered
	toolsNative toolMode = "native" // Ollama's tools field
	toolsSchema toolMode = "schema" // instruction + JSON Schema format
)

// Chat streams a reply from /api/chat. It sends num_ctx (the model's
// context length), num_predict (req.MaxTokens, else Config.NumPredict)
// and keep_alive. onDelta gets each streamed fragment of content; when
// tools are offered through a JSON Schema (the model lacks native tool
// calling and req.Format is empty), the fragments are the raw JSON reply,
// which Chat then turns into ToolCalls or into Content (the answer). If
// that reply cannot be read, typically because it was cut at the token
// cap, it is returned as Content with Ollama's finish reason ("length").
// When req.Format is set it must be "json" or a JSON Schema that
// compiles; Ollama gets the part of the schema its grammar handles (see
// grammarSchema), so the caller validates the reply against the full
// schema (models.Structured does). Tools are then offered only to models
// with native tool calling. Tool calls without an ID get
// a random "call_…" one.
//
// Ollama is told never to cut the prompt (truncate and shift false): a
// prompt longer than num_ctx fails with models.KindContextTooLong instead
// of being answered from its tail. Prompt sizes are estimated
// (models.EstimateTokens) and calibrated per model with the
// prompt_eval_count of each reply (models.Calibration); after such a
// refusal the model's prompts are counted higher and, when the model
// holds more than the num_ctx sent, the call is sent again with a larger
// one (at most 3 sends). A runner that dies serving the call gives
// models.KindCrashed.
//
// Cancelling ctx makes Chat return at once with an error wrapping
// ctx.Err() and no further delta; the reply is then drained in the
// background for up to Config.CancelDrain before the connection closes.
func (p *Provider) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	if err := ctx.Err(); err != nil {
		return models.ChatResponse{}, fmt.Errorf("ollama chat %s: %w", req.Model, err)
	}
	info, err := p.Show(ctx, req.Model)
	if err != nil {
		return models.ChatResponse{}, err
	}
	estimate := models.EstimateTokens(req.Messages, req.Tools)
	for attempt := 1; ; attempt++ {
		areq, mode, err := p.request(req, info)
		if err != nil {
			return models.ChatResponse{}, fmt.Errorf("ollama chat %s: %w", req.Model, err)
		}
		resp, err := p.chat(ctx, req, areq, mode, onDelta)
		if err == nil {
			p.calib.Observe(req.Model, estimate, resp.Usage.PromptTokens)
			return resp, nil
		}
		sent, _ := areq.Options["num_ctx"].(int)
		if models.KindOf(err) != models.KindContextTooLong || sent == 0 {
			return resp, err
		}
		// Ollama counted more tokens than the estimate: count higher
		// from now on, and try once more if the model holds more than
		// the num_ctx that was sent (or refuse before sending).
		p.calib.Exceeded(req.Model, estimate, sent)
		if sent >= info.ContextLength || attempt >= 3 {
			return resp, err
		}
	}
}

// chat sends areq, built from req, and reads the reply.
func (p *Provider) chat(ctx context.Context, req models.ChatRequest, areq *api.ChatRequest, mode toolMode, onDelta func(models.Delta)) (models.ChatResponse, error) {
	start := p.now()
	st := p.startChat(areq)
	if st == nil {
		return models.ChatResponse{}, fmt.Errorf("ollama chat %s: provider closed: %w", req.Model, models.ErrUnavailable)
	}
	defer st.abandon(p.cancelDrain) // whichever way Chat returns, even by a panic in onDelta
	var (
		content strings.Builder
		calls   []api.ToolCall
		final   api.ChatResponse
		done    bool
	)
	for r := range st.chunks(ctx) {
		content.WriteString(r.Message.Content)
		if onDelta != nil {
			// Every chunk, even one without content (a native tool
			// call), tells the caller that the model is generating.
			onDelta(models.Delta{Content: r.Message.Content})
		}
		calls = append(calls, r.Message.ToolCalls...)
		if r.Done {
			final, done = r, true
		}
	}
	if err := ctx.Err(); err != nil {
		return models.ChatResponse{}, fmt.Errorf("ollama chat %s: %w", req.Model, err)
	}
	switch err := st.wait(); {
	case (err != nil || !done) && p.life.Err() != nil:
		return models.ChatResponse{}, fmt.Errorf("ollama chat %s: provider closed: %w", req.Model, models.ErrUnavailable)
	case err != nil:
		return models.ChatResponse{}, p.wrap(ctx, "chat", req.Model, err)
	case !done:
		return models.ChatResponse{}, &models.Error{Kind: models.KindNetwork, Provider: "ollama", Model: req.Model, Msg: "the reply stream ended before it was complete"}
	}

	resp := models.ChatResponse{
		Model:        req.Model,
		Message:      models.Message{Role: models.RoleAssistant, Content: content.String()},
		Usage:        models.Usage{PromptTokens: final.PromptEvalCount, CompletionTokens: final.EvalCount},
		FinishReason: final.DoneReason,
		ModelDigest:  p.digest(ctx, req.Model),
	}
	for _, c := range calls {
		resp.Message.ToolCalls = append(resp.Message.ToolCalls, fromAPIToolCall(c))
	}
	if mode == toolsSchema {
		if calls, answer, ok := parseChoice(resp.Message.Content, req.Tools); ok {
			resp.Message.Content, resp.Message.ToolCalls = answer, calls
		} else {
			p.log.LogAttrs(ctx, slog.LevelWarn, "ollama: unreadable tool choice; returning it as content",
				slog.String(logkey.Model, req.Model), slog.String(logkey.FinishReason, final.DoneReason))
		}
	}
	p.log.LogAttrs(ctx, slog.LevelDebug, "ollama chat",
		slog.String(logkey.Model, req.Model),
		slog.String(logkey.ToolMode, string(mode)),
		slog.Int(logkey.PromptTokens, resp.Usage.PromptTokens),
		slog.Int(logkey.CompletionTokens, resp.Usage.CompletionTokens),
		slog.Int(logkey.ToolCalls, len(resp.Message.ToolCalls)),
		slog.String(logkey.FinishReason, resp.FinishReason),
		slog.Duration(logkey.Duration, p.now().Sub(start)),
	)
	return resp, nil
}

// stream is one /api/chat call read on its own goroutine, so that Chat
// can return when its context is done while the reply is still drained.
type stream struct {
	out       chan api.ChatResponse // closed when the reply ends
	err       error                 // the api client's result; read after out is closed
	ended     chan struct{}         // closed when the goroutine ends
	abandoned chan struct{}         // closed when Chat returns
	cancel    context.CancelFunc    // disconnects
}

// startChat sends areq and reads the reply on a new goroutine, which
// p.readers tracks; nil means p is closed. The request's context is p's
// lifetime, not the caller's: a cancelled call must not disconnect at
// once (see Config.CancelDrain).
func (p *Provider) startChat(areq *api.ChatRequest) *stream {
	p.readersMu.Lock()
	defer p.readersMu.Unlock()
	if p.closed {
		return nil
	}
	ctx, cancel := context.WithCancel(p.life)
	st := &stream{out: make(chan api.ChatResponse), ended: make(chan struct{}), abandoned: make(chan struct{}), cancel: cancel}
	p.readers.Add(1)
	go func() {
		defer p.readers.Done()
		defer close(st.ended)
		defer cancel()
		defer close(st.out)
		st.err = p.client.Chat(ctx, areq, func(r api.ChatResponse) error {
			select {
			case st.out <- r:
				return nil
			case <-st.abandoned:
				return nil // drained unseen, so Ollama can finish the reply
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	return st
}

// chunks yields the reply's chunks until it ends or ctx is done.
func (st *stream) chunks(ctx context.Context) func(yield func(api.ChatResponse) bool) {
	return func(yield func(api.ChatResponse) bool) {
		for {
			select {
			case r, ok := <-st.out:
				// Both may be ready: no delta once ctx is done.
				if !ok || ctx.Err() != nil || !yield(r) {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}
}

// wait returns the api client's result once the reply has ended.
func (st *stream) wait() error {
	for range st.out {
	}
	return st.err
}

// abandon is called once, when Chat returns. A reply still streaming is
// drained for up to drain, then disconnected; drain <= 0 disconnects at
// once.
func (st *stream) abandon(drain time.Duration) {
	close(st.abandoned)
	select {
	case <-st.ended:
		return
	default:
	}
	if drain <= 0 {
		st.cancel()
		return
	}
	time.AfterFunc(drain, st.cancel)
}

// request builds the /api/chat request for req to the model info.
func (p *Provider) request(req models.ChatRequest, info models.ModelInfo) (*api.ChatRequest, toolMode, error) {
	native := info.Has(models.CapTools)
	msgs, err := toAPIMessages(req.Messages, native)
	if err != nil {
		return nil, "", err
	}
	numPredict := p.numPredict
	if req.MaxTokens > 0 {
		numPredict = req.MaxTokens
	}
	opts := map[string]any{"num_predict": numPredict}
	if p.numThread > 0 {
		opts["num_thread"] = p.numThread
	}
	if req.Temperature != nil {
		opts["temperature"] = *req.Temperature
	}
	if req.Seed != nil {
		opts["seed"] = *req.Seed
	}
	if info.ContextLength > 0 {
		// Ollama refuses a prompt longer than num_ctx (truncate false,
		// below), so a prompt that cannot fit is refused here, by the
		// estimate calibrated with what Ollama counted before.
		prompt := p.calib.Tokens(req.Model, models.EstimateTokens(req.Messages, req.Tools))
		if prompt+minReply > info.ContextLength {
			return nil, "", &models.Error{Kind: models.KindContextTooLong, Provider: "ollama", Model: req.Model,
				Msg: fmt.Sprintf("the prompt is about %d tokens and %s holds %d with room for a reply; shorten it or use a model with a longer context (nothing was sent)", prompt, req.Model, info.ContextLength)}
		}
		if numPredict > 0 {
			numPredict = min(numPredict, info.ContextLength-prompt)
			opts["num_predict"] = numPredict
		}
		opts["num_ctx"] = p.numCtx(req.Model, prompt+max(numPredict, minReply), info.ContextLength)
	}
	// Ollama cuts a prompt longer than num_ctx silently by default
	// (truncate), and drops the start of the context when the reply
	// fills it (shift): keel wants an error instead, and fits the
	// context itself.
	stream, truncate, shift := true, false, false
	areq := &api.ChatRequest{
		Model:     req.Model,
		Messages:  msgs,
		Stream:    &stream,
		KeepAlive: &api.Duration{Duration: p.keepAlive},
		Options:   opts,
		Truncate:  &truncate,
		Shift:     &shift,
	}
	if len(req.Format) > 0 {
		if areq.Format, err = formatSchema(req.Format); err != nil {
			return nil, "", err
		}
	}

	mode := toolsNone
	switch {
	case len(req.Tools) == 0:
	case native:
		if areq.Tools, err = toAPITools(req.Tools); err != nil {
			return nil, "", err
		}
		mode = toolsNative
	case len(req.Format) > 0:
		// The caller's schema wins: a tool choice could not satisfy it.
		p.log.Debug("ollama: tools not offered: the model has no native tool calling and the request sets a format",
			slog.String(logkey.Model, req.Model), slog.Int(logkey.Tools, len(req.Tools)))
	default:
		if areq.Format, err = toolChoiceSchema(req.Tools); err != nil {
			return nil, "", err
		}
		areq.Messages = withInstruction(areq.Messages, toolInstruction(req.Tools))
		mode = toolsSchema
	}
	return areq, mode, nil
}

// toAPIMessages maps messages to Ollama's. Without native tool calling a
// model's template ignores tool calls and the "tool" role, so an
// assistant's calls are written into its content in the JSON form the
// model is asked to reply in, and tool results become user messages.
func toAPIMessages(ms []models.Message, native bool) ([]api.Message, error) {
	out := make([]api.Message, 0, len(ms))
	for _, m := range ms {
		am := api.Message{Role: string(m.Role), Content: m.Content}
		for _, img := range m.Images {
			am.Images = append(am.Images, api.ImageData(img))
		}
		switch {
		case m.Role == models.RoleAssistant && len(m.ToolCalls) > 0 && native:
			for i, c := range m.ToolCalls {
				tc, err := toAPIToolCall(i, c)
				if err != nil {
					return nil, err
				}
				am.ToolCalls = append(am.ToolCalls, tc)
			}
		case m.Role == models.RoleAssistant && len(m.ToolCalls) > 0:
			parts := []string{}
			if m.Content != "" {
				parts = append(parts, m.Content)
			}
			for _, c := range m.ToolCalls {
				b, err := json.Marshal(choice{Tool: &c.Name, Arguments: argsOrEmpty(c.Arguments)})
				if err != nil {
					return nil, fmt.Errorf("tool call %s: arguments: %w: %w", c.ID, models.ErrInvalidRequest, err)
				}
				parts = append(parts, string(b))
			}
			am.Content = strings.Join(parts, "\n")
		case m.Role == models.RoleTool && native:
			am.ToolName, am.ToolCallID = m.ToolName, m.ToolCallID
		case m.Role == models.RoleTool:
			am.Role = string(models.RoleUser)
			am.Content = fmt.Sprintf("Result of tool %s (call %s):\n%s", m.ToolName, m.ToolCallID, m.Content)
		}
		out = append(out, am)
	}
	return out, nil
}

func argsOrEmpty(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

func toAPIToolCall(i int, c keel.ToolCall) (api.ToolCall, error) {
	args := api.NewToolCallFunctionArguments()
	if raw := argsOrEmpty(c.Arguments); string(raw) != "null" {
		if err := json.Unmarshal(raw, &args); err != nil {
			return api.ToolCall{}, fmt.Errorf("tool call %s: arguments are not a JSON object: %w: %w", c.ID, models.ErrInvalidRequest, err)
		}
	}
	return api.ToolCall{
		ID:       c.ID,
		Function: api.ToolCallFunction{Index: i, Name: c.Name, Arguments: args},
	}, nil
}

func fromAPIToolCall(c api.ToolCall) keel.ToolCall {
	id := c.ID
	if id == "" {
		id = newCallID()
	}
	args, err := json.Marshal(c.Function.Arguments)
	if err != nil || len(args) == 0 {
		args = []byte("{}")
	}
	return keel.ToolCall{ID: id, Name: c.Function.Name, Arguments: args}
}

// newCallID returns "call_" and 12 random hex digits.
func newCallID() string {
	var b [6]byte
	rand.Read(b[:]) // never fails
	return "call_" + hex.EncodeToString(b[:])
}

// toAPITools maps tool specs to Ollama's function tools. Ollama's
// parameter type keeps only type, description, enum, items, anyOf and
// properties of each property; the model sees no more than that.
func toAPITools(specs []keel.ToolSpec) (api.Tools, error) {
	out := make(api.Tools, 0, len(specs))
	for _, s := range specs {
		var params api.ToolFunctionParameters
		if err := json.Unmarshal(inputSchema(s), &params); err != nil {
			return nil, fmt.Errorf("tool %s: input schema: %w: %w", s.Name, models.ErrInvalidRequest, err)
		}
		if params.Type == "" {
			params.Type = "object"
		}
		if params.Properties == nil {
			params.Properties = api.NewToolPropertiesMap()
		}
		out = append(out, api.Tool{
			Type:     "function",
			Function: api.ToolFunction{Name: s.Name, Description: s.Description, Parameters: params},
		})
	}
	return out, nil
}

func inputSchema(s keel.ToolSpec) json.RawMessage {
	if len(bytes.TrimSpace(s.InputSchema)) == 0 {
		return json.RawMessage(`{"type":"object"}`)
	}
	return s.InputSchema
}

// choice is the reply a model without native tool calling is asked for:
// a tool call or an answer. Field order is the order the model writes.
type choice struct {
	Tool      *string         `json:"tool,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Answer    *string         `json:"answer,omitempty"`
}

// toolChoiceSchema returns the JSON Schema of a choice among specs:
//
//	{"anyOf": [
//	  {"type":"object","properties":{"tool":{"const":NAME},"arguments":INPUT_SCHEMA},
//	   "required":["tool","arguments"],"additionalProperties":false},
//	  … one per tool …,
//	  {"type":"object","properties":{"answer":{"type":"string"}},
//	   "required":["answer"],"additionalProperties":false}]}
//
// Ollama v0.17.4 compiles it to a grammar (llama.cpp supports anyOf and
// const) and keeps the property order, so the model names the tool before
// writing its arguments.
func toolChoiceSchema(specs []keel.ToolSpec) (json.RawMessage, error) {
	type constant struct {
		Const string `json:"const"`
	}
	type callProps struct {
		Tool      constant        `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	type answerProps struct {
		Answer struct {
			Type string `json:"type"`
		} `json:"answer"`
	}
	alts := make([]any, 0, len(specs)+1)
	for _, s := range specs {
		in := inputSchema(s)
		if !json.Valid(in) {
			return nil, fmt.Errorf("tool %s: input schema is not JSON: %w", s.Name, models.ErrInvalidRequest)
		}
		in = grammarSchema(in)
		alts = append(alts, object[callProps]{
			Type:       "object",
			Properties: callProps{Tool: constant{s.Name}, Arguments: in},
			Required:   []string{"tool", "arguments"},
		})
	}
	ans := object[answerProps]{Type: "object", Required: []string{"answer"}}
	ans.Properties.Answer.Type = "string"
	alts = append(alts, ans)
	b, err := json.Marshal(struct {
		AnyOf []any `json:"anyOf"`
	}{alts})
	if err != nil {
		return nil, fmt.Errorf("tool choice schema: %w: %w", models.ErrInvalidRequest, err)
	}
	return b, nil
}

// object is a JSON Schema of an object whose properties, in field order,
// are those of P.
type object[P any] struct {
	Type                 string   `json:"type"`
	Properties           P        `json:"properties"`
	Required             []string `json:"required"`
	AdditionalProperties bool     `json:"additionalProperties"`
}

// toolInstruction tells a model without native tool calling how to call
// the tools.
func toolInstruction(specs []keel.ToolSpec) string {
	var b strings.Builder
	b.WriteString("You can use tools. Reply with one JSON object and nothing else, either\n")
	b.WriteString(`{"tool": "<tool name>", "arguments": {<arguments matching the tool's input schema>}}` + " to call a tool, or\n")
	b.WriteString(`{"answer": "<your final answer>"}` + " to answer without calling a tool.\n\nTools:\n")
	for _, s := range specs {
		var schema bytes.Buffer
		if err := json.Compact(&schema, inputSchema(s)); err != nil {
			schema.Reset()
			schema.Write(inputSchema(s))
		}
		fmt.Fprintf(&b, "- %s: %s\n  input schema: %s\n", s.Name, s.Description, schema.String())
	}
	return b.String()
}

// withInstruction adds text to the leading system message, or puts a
// system message first.
func withInstruction(msgs []api.Message, text string) []api.Message {
	if len(msgs) > 0 && msgs[0].Role == string(models.RoleSystem) {
		msgs[0].Content = strings.TrimRight(msgs[0].Content, "\n") + "\n\n" + text
		return msgs
	}
	return append([]api.Message{{Role: string(models.RoleSystem), Content: text}}, msgs...)
}

// parseChoice reads a reply constrained by toolChoiceSchema. ok is false
// when content is not a choice among specs.
func parseChoice(content string, specs []keel.ToolSpec) (calls []keel.ToolCall, answer string, ok bool) {
	var c choice
	if err := json.Unmarshal([]byte(content), &c); err != nil {
		return nil, "", false
	}
	if c.Tool != nil {
		for _, s := range specs {
			if s.Name != *c.Tool {
				continue
			}
			var args bytes.Buffer
			if err := json.Compact(&args, argsOrEmpty(c.Arguments)); err != nil {
				return nil, "", false
			}
			return []keel.ToolCall{{ID: newCallID(), Name: s.Name, Arguments: args.Bytes()}}, "", true
		}
		return nil, "", false
	}
	if c.Answer != nil {
		return nil, *c.Answer, true
	}
	return nil, "", false
}

// wrap classifies an error of the api client for operation op on model
// as a *models.Error.
func (p *Provider) wrap(ctx context.Context, op, model string, err error) error {
	e := &models.Error{Provider: "ollama", Model: model, Err: err}
	if ctxErr := ctx.Err(); ctxErr != nil {
		e.Kind, e.Msg, e.Err = models.KindCancelled, op+" cancelled", ctxErr
		return e
	}
	var se api.StatusError
	if errors.As(err, &se) {
		e.Status = se.StatusCode
		switch code := se.StatusCode; {
		case code == http.StatusNotFound:
			e.Kind, e.Msg = models.KindNotFound, fmt.Sprintf("%s: pull it with `keel models pull %s`", op, model)
		case code == http.StatusInternalServerError && isFormatError(se.ErrorMessage):
			e.Kind, e.Msg = models.KindInvalidRequest, op+": Ollama refused the output schema"
		case (code == http.StatusBadRequest || code == http.StatusInternalServerError) && isTooLong(se.ErrorMessage):
			// 500: /api/embeddings passes the runner's 400 on as one.
			e.Kind, e.Msg = models.KindContextTooLong, fmt.Sprintf("%s: the prompt is longer than the context Ollama was given for %s; it was refused, not cut", op, model)
		case code >= 500 && isCrash(se.ErrorMessage):
			e.Kind, e.Msg = models.KindCrashed, crashMsg(op, model, p.Endpoint())
		case code == http.StatusTooManyRequests:
			e.Kind, e.Msg = models.KindRateLimited, fmt.Sprintf("%s: Ollama at %s is busy (OLLAMA_MAX_QUEUE reached)", op, p.Endpoint())
		case code >= 500:
			e.Kind, e.Msg = models.KindOverloaded, fmt.Sprintf("%s: Ollama at %s failed, see its server log", op, p.Endpoint())
		case code == http.StatusUnauthorized || code == http.StatusForbidden:
			e.Kind, e.Msg = models.KindAuth, fmt.Sprintf("%s: Ollama at %s refused access", op, p.Endpoint())
		default:
			e.Kind, e.Msg = models.KindInvalidRequest, op
		}
		return e
	}
	var ae api.AuthorizationError
	if errors.As(err, &ae) {
		e.Kind, e.Msg = models.KindAuth, fmt.Sprintf("%s: Ollama at %s requires authorization", op, p.Endpoint())
		return e
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		e.Kind, e.Msg = models.KindNetwork, fmt.Sprintf("%s: cannot reach Ollama at %s: is Ollama running? start it with `ollama serve` or set OLLAMA_HOST", op, p.Endpoint())
		return e
	}
	// An error Ollama streams after the reply began reaches us as a bare
	// string error; it means the server failed mid-generation.
	if isCrash(err.Error()) {
		e.Kind, e.Msg = models.KindCrashed, crashMsg(op, model, p.Endpoint())
		return e
	}
	e.Kind, e.Msg = models.KindOverloaded, op+": Ollama failed mid-reply"
	return e
}

// crashMsg says that Ollama's model runner died serving a call.
func crashMsg(op, model, endpoint string) string {
	return fmt.Sprintf("%s: the model runner of Ollama at %s died serving %s; not retried, since the same request tends to crash it again (see Ollama's server log)", op, endpoint, model)
}

// isCrash reports whether an Ollama error message says its model runner
// process died: at load ("llama runner process has terminated"), before
// the reply ("model runner has unexpectedly stopped") or during it ("an
// error was encountered while running the model", llm/server.go of
// v0.17.4). Ollama marks these with status 500 like any other failure,
// so only the text tells them apart.
func isCrash(msg string) bool {
	for _, m := range []string{"llama runner process has terminated", "model runner has unexpectedly stopped", "an error was encountered while running the model"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// isTooLong reports whether an HTTP 400 message is Ollama's runner
// refusing a prompt longer than num_ctx, which it does instead of cutting
// the prompt when the request sets "truncate": false (runner.go of
// v0.17.4: "the input length exceeds the context length").
func isTooLong(msg string) bool {
	return strings.Contains(msg, "input length exceeds the context length")
}

// isFormatError reports whether an HTTP 500 message is Ollama refusing a
// request's format. Ollama v0.17.4 returns these with status 500 and no
// other marker (llm/server.go, Completion), so only the text tells them
// from a server failure.
func isFormatError(msg string) bool {
	return strings.HasPrefix(msg, "invalid JSON schema in format") || strings.HasPrefix(msg, "invalid format:")
}
