package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/zalando/go-keyring"

	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// Defaults of Config.
const (
	DefaultName      = "openai"
	DefaultBaseURL   = "https://api.openai.com/v1"
	DefaultAPIKeyEnv = "OPENAI_API_KEY"
	DefaultTimeout   = 5 * time.Minute
)

// listTTL is how long the server's model list (Config.Discover) is reused.
const listTTL = 30 * time.Second

// keyringTimeout bounds one OS keyring lookup: the Secret Service may wait
// for the user to unlock a collection, or never answer at all.
const keyringTimeout = 5 * time.Second

// Config configures a Provider. The zero value talks to OpenAI's API with
// the key in $OPENAI_API_KEY, treats every call as leaving the machine and
// serves no model: declare them in Models.
type Config struct {
	// Name is the provider's name in ModelInfo, errors and routing rules;
	// "" means DefaultName. Give each configured server its own name.
	Name string
	// BaseURL is the root of the OpenAI-compatible API, with its version
	// path: "https://api.openai.com/v1", "http://127.0.0.1:8080/v1". ""
	// means DefaultBaseURL.
	BaseURL string

	// APIKeyEnv names the environment variable holding the API key. It is
	// read on every call, so a key set after start is picked up. "" means
	// DefaultAPIKeyEnv when BaseURL is also "" (OpenAI itself) and
	// KeyringService is "", and no variable otherwise.
	APIKeyEnv string
	// KeyringService and KeyringUser name the API key in the OS keyring
	// (Secret Service on Linux, Keychain on macOS, Credential Manager on
	// Windows), used when the APIKeyEnv variable is unset or empty.
	// KeyringUser "" means Name. A keyring that does not answer within 5s
	// fails the call with KindAuth. The key read is kept until the server
	// refuses it.
	//
	// With neither an environment variable nor a keyring entry configured,
	// requests carry no Authorization header, as local servers expect.
	// The key is never logged nor put in an error.
	KeyringService string
	KeyringUser    string

	// Models are the models the server serves, with what they can do and
	// cost: compatible servers rarely describe their models, so they are
	// declared. A Chat or Embed for a model that is not declared (nor
	// discovered) fails with KindNotFound without contacting the server.
	Models []ModelConfig
	// Discover adds the models the server lists at GET /models to the
	// declared ones, as completion models with unknown context length and
	// no price. Meant for local servers, whose loaded models change; for a
	// paid API declare the models with their prices instead. When the list
	// cannot be fetched, Models returns the declared models.
	Discover bool

	// Local marks a server on this machine: its models are listed with
	// Cloud false, so private content may be sent to them. The default,
	// false, treats every call as sending data off the machine.
	Local bool
	// MaxCompletionTokens sends ChatRequest.MaxTokens as
	// max_completion_tokens, which OpenAI's reasoning models require,
	// instead of max_tokens, which every compatible server understands.
	MaxCompletionTokens bool

	// HTTPClient sends the requests; nil means http.DefaultClient. Its
	// Timeout, if any, bounds whole streamed replies: prefer contexts.
	HTTPClient *http.Client
	// Logger receives a debug record per call (never the key); nil
	// discards.
	Logger *slog.Logger
	// Timeout bounds each call that does not stream: listing models,
	// embeddings, and Chat without onDelta. 0 means DefaultTimeout,
	// negative means no limit. Streamed chats are bounded by their context.
	Timeout time.Duration
}

// ModelConfig declares one model of the server.
type ModelConfig struct {
	Name string
	// ContextLength is the model's context in tokens; 0 means unknown.
	ContextLength int
	// Capabilities are what the model can do; empty means
	// models.CapCompletion only.
	Capabilities []models.Capability
	// Price is what the model charges; nil means free.
	Price  *models.Price
	Family string
}

// Provider is a models.Provider and models.Embedder for a server speaking
// OpenAI's chat completions API, through the official client
// github.com/openai/openai-go/v3 with its retries disabled (the router
// retries with its own classification). It is safe for concurrent use and
// starts no goroutine except, for at most keyringTimeout past a call, one
// OS keyring lookup at a time.
type Provider struct {
	name      string
	base      *url.URL
	declared  []models.ModelInfo
	discover  bool
	local     bool
	maxCompl  bool
	timeout   time.Duration
	log       *slog.Logger
	chatSvc   openai.ChatCompletionService
	embedSvc  openai.EmbeddingService
	modelSvc  openai.ModelService
	keys      keySource
	listMu    sync.Mutex
	listed    []string // names from GET /models
	listedExp time.Time
}

// New returns a Provider for the server cfg describes. It does not contact
// the server; a malformed config is the only error.
func New(cfg Config) (*Provider, error) {
	p := &Provider{
		name:     cfg.Name,
		discover: cfg.Discover,
		local:    cfg.Local,
		maxCompl: cfg.MaxCompletionTokens,
		timeout:  cfg.Timeout,
		log:      cfg.Logger,
	}
	if p.name == "" {
		p.name = DefaultName
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	rawURL := cfg.BaseURL
	if rawURL == "" {
		rawURL = DefaultBaseURL
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai provider %s: base URL %q: want http(s)://host[:port]/path", p.name, rawURL)
	}
	p.base = u

	seen := map[string]bool{}
	for _, m := range cfg.Models {
		if m.Name == "" || seen[m.Name] {
			return nil, fmt.Errorf("openai provider %s: model name %q is empty or declared twice", p.name, m.Name)
		}
		seen[m.Name] = true
		p.declared = append(p.declared, p.info(m))
	}
	if len(p.declared) == 0 && !p.discover {
		return nil, fmt.Errorf("openai provider %s: no models: declare them in Config.Models or set Config.Discover", p.name)
	}

	env := cfg.APIKeyEnv
	if env == "" && cfg.BaseURL == "" && cfg.KeyringService == "" {
		env = DefaultAPIKeyEnv
	}
	p.keys = keySource{env: env, service: cfg.KeyringService, user: cfg.KeyringUser, get: keyring.Get, timeout: keyringTimeout}
	if p.keys.service != "" && p.keys.user == "" {
		p.keys.user = p.name
	}

	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	// The services are built without openai.NewClient, which would read
	// OPENAI_* variables (keys, base URL, headers) of whatever server this
	// is: a provider sends what its Config says and nothing else.
	opts := []option.RequestOption{
		option.WithBaseURL(u.String()),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	p.chatSvc = openai.NewChatCompletionService(opts...)
	p.embedSvc = openai.NewEmbeddingService(opts...)
	p.modelSvc = openai.NewModelService(opts...)
	return p, nil
}

// info describes the declared model m.
func (p *Provider) info(m ModelConfig) models.ModelInfo {
	info := models.ModelInfo{
		Name:          m.Name,
		Provider:      p.name,
		Capabilities:  slices.Clone(m.Capabilities),
		ContextLength: m.ContextLength,
		Family:        m.Family,
		Cloud:         !p.local,
	}
	if len(info.Capabilities) == 0 {
		info.Capabilities = []models.Capability{models.CapCompletion}
	}
	if m.Price != nil {
		price := *m.Price
		info.Price = &price
	}
	return info
}

// Name returns Config.Name, by default "openai".
func (p *Provider) Name() string { return p.name }

// BaseURL returns the API root the provider talks to, with any password
// redacted.
func (p *Provider) BaseURL() string { return p.base.Redacted() }

// Models lists the declared models and, with Config.Discover, those the
// server lists at GET /models (reused for 30s). When that list cannot be
// fetched it returns the declared models, or, when there are none, an
// error wrapping models.ErrUnavailable.
func (p *Provider) Models(ctx context.Context) ([]models.ModelInfo, error) {
	out := make([]models.ModelInfo, 0, len(p.declared))
	for _, m := range p.declared {
		out = append(out, clone(m))
	}
	if !p.discover {
		return out, nil
	}
	names, err := p.list(ctx)
	if err != nil {
		if len(out) == 0 {
			return nil, err
		}
		p.log.LogAttrs(ctx, slog.LevelDebug, "openai: model list unavailable; listing the declared models",
			slog.String(logkey.Provider, p.name), slog.String(logkey.Err, err.Error()))
		return out, nil
	}
	for _, name := range names {
		if _, ok := p.declaredInfo(name); !ok {
			out = append(out, models.ModelInfo{
				Name: name, Provider: p.name, Cloud: !p.local,
				Capabilities: []models.Capability{models.CapCompletion},
			})
		}
	}
	return out, nil
}

func clone(m models.ModelInfo) models.ModelInfo {
	m.Capabilities = slices.Clone(m.Capabilities)
	if m.Price != nil {
		price := *m.Price
		m.Price = &price
	}
	return m
}

func (p *Provider) declaredInfo(name string) (models.ModelInfo, bool) {
	for _, m := range p.declared {
		if m.Name == name {
			return m, true
		}
	}
	return models.ModelInfo{}, false
}

// serves returns nil when model is declared or discovered, else an error
// of KindNotFound (or the failure to fetch the server's list).
func (p *Provider) serves(ctx context.Context, model string) error {
	if model == "" {
		return p.errorf(models.KindInvalidRequest, model, nil, "no model named in the request")
	}
	if _, ok := p.declaredInfo(model); ok {
		return nil
	}
	if p.discover {
		names, err := p.list(ctx)
		if err != nil {
			return err
		}
		if slices.Contains(names, model) {
			return nil
		}
	}
	declared := make([]string, len(p.declared))
	for i, m := range p.declared {
		declared[i] = m.Name
	}
	return p.errorf(models.KindNotFound, model, nil,
		"provider %s does not serve this model: declare it in the provider's models (declared: %s)",
		p.name, strings.Join(declared, ", "))
}

// list returns the model names of GET /models, reused for listTTL.
func (p *Provider) list(ctx context.Context) ([]string, error) {
	p.listMu.Lock()
	if time.Now().Before(p.listedExp) {
		names := p.listed
		p.listMu.Unlock()
		return names, nil
	}
	p.listMu.Unlock()

	key, err := p.keys.key(ctx, p, "")
	if err != nil {
		return nil, err
	}
	tctx, cancel := p.withTimeout(ctx)
	defer cancel()
	var (
		res  *http.Response
		body []byte
		page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
	)
	if _, err := p.modelSvc.List(tctx, p.callOptions(key, &res, &body)...); err != nil {
		return nil, p.classify(ctx, tctx, "", key, res, err)
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, p.invalidReply("", err)
	}
	names := make([]string, 0, len(page.Data))
	for _, m := range page.Data {
		if m.ID != "" {
			names = append(names, m.ID)
		}
	}
	p.listMu.Lock()
	p.listed, p.listedExp = names, time.Now().Add(listTTL)
	p.listMu.Unlock()
	return names, nil
}

// withTimeout bounds a call that does not stream by Config.Timeout.
func (p *Provider) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.timeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.timeout)
}

// callOptions are the per-call options: the key, when there is one, where
// to keep the HTTP response for classifying errors, and, when body is not
// nil, where to keep the reply undecoded. Decoding replies here, rather
// than in the client, tells a reply that is not JSON from a connection
// broken while reading it: the client reports both as an unexpected EOF.
func (p *Provider) callOptions(key string, res **http.Response, body *[]byte) []option.RequestOption {
	opts := []option.RequestOption{option.WithResponseInto(res)}
	if body != nil {
		opts = append(opts, option.WithResponseBodyInto(body))
	}
	if key != "" {
		opts = append(opts, option.WithAPIKey(key))
	}
	return opts
}
