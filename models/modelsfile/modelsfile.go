// Package modelsfile reads the model layer's configuration file,
// models.json (docs/models.md), and builds the model layer from it: the
// local provider, the OpenAI-compatible providers it declares, and the
// router over them with its routes, limits and budgets.
package modelsfile

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/keel-runtime/keel/internal/jsonfile"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/openai"
)

// Name is the name of the model layer's configuration in the data
// directory. Without it keel uses the local Ollama only, with the
// router's default limits, and no cloud. docs/models.md documents it.
const Name = "models.json"

// LocalName is the name Load gives the local provider.
const LocalName = "ollama"

// modelsFile is the JSON of a models.json.
type modelsFile struct {
	// AllowCloud is the master switch for cloud providers.
	AllowCloud bool `json:"allow_cloud"`
	// DayBudget caps what all model calls of a UTC day spend.
	DayBudget models.Limits `json:"day_budget"`
	// Ollama sets the limits for the local Ollama.
	Ollama limitsJSON `json:"ollama"`
	// Providers are OpenAI-compatible servers, by the name routes use.
	Providers map[string]openAIJSON `json:"providers"`
	Routes    []models.Route        `json:"routes"`
}

type limitsJSON struct {
	Timeout           duration `json:"timeout"`
	FirstTokenTimeout duration `json:"first_token_timeout"`
	MaxConcurrent     int      `json:"max_concurrent"`
	RequestsPerMinute float64  `json:"requests_per_minute"`
	MaxRetries        int      `json:"max_retries"`
	DefaultMaxTokens  int      `json:"default_max_tokens"`
}

type openAIJSON struct {
	limitsJSON
	BaseURL             string            `json:"base_url"`
	APIKeyEnv           string            `json:"api_key_env"`
	KeyringService      string            `json:"keyring_service"`
	KeyringUser         string            `json:"keyring_user"`
	Local               bool              `json:"local"`
	Discover            bool              `json:"discover"`
	MaxCompletionTokens bool              `json:"max_completion_tokens"`
	Models              []openAIModelJSON `json:"models"`
}

type openAIModelJSON struct {
	Name          string              `json:"name"`
	ContextLength int                 `json:"context_length"`
	Capabilities  []models.Capability `json:"capabilities"`
	Price         *models.Price       `json:"price"`
}

// duration is a time.Duration written as "90s" in JSON.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"90s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

func (l limitsJSON) apply(pc models.ProviderConfig) models.ProviderConfig {
	pc.Timeout = time.Duration(l.Timeout)
	pc.FirstTokenTimeout = time.Duration(l.FirstTokenTimeout)
	pc.MaxConcurrent = l.MaxConcurrent
	pc.RequestsPerMinute = l.RequestsPerMinute
	pc.MaxRetries = l.MaxRetries
	pc.DefaultMaxTokens = l.DefaultMaxTokens
	return pc
}

// readModelsFile reads path; a missing file is the empty configuration.
func readModelsFile(path string) (modelsFile, error) {
	return jsonfile.Read[modelsFile](path, "docs/models.md")
}

// Load builds the model layer: local is the Ollama provider (or a test's
// provider) under the name LocalName, plus the OpenAI-compatible
// providers of the models configuration at path (a missing file
// declares none). It also returns every provider by name. A file that
// does not parse, or declares a provider it cannot make, is an error
// naming the file.
func Load(path string, local models.Provider, ledger models.Ledger, log *slog.Logger) (*models.Router, map[string]models.ProviderConfig, error) {
	f, err := readModelsFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("models configuration: %w", err)
	}
	providers := map[string]models.ProviderConfig{LocalName: f.Ollama.apply(models.ProviderConfig{Provider: local})}
	for name, pj := range f.Providers {
		if _, dup := providers[name]; dup {
			return nil, nil, fmt.Errorf("models configuration %s: provider name %q is taken by the local Ollama", path, name)
		}
		cfg := openai.Config{
			Name: name, BaseURL: pj.BaseURL, APIKeyEnv: pj.APIKeyEnv,
			KeyringService: pj.KeyringService, KeyringUser: pj.KeyringUser,
			Local: pj.Local, Discover: pj.Discover, MaxCompletionTokens: pj.MaxCompletionTokens,
			Logger: log.With(logkey.Component, "provider", logkey.Provider, name),
		}
		prices := map[string]models.Price{}
		for _, m := range pj.Models {
			cfg.Models = append(cfg.Models, openai.ModelConfig{Name: m.Name, ContextLength: m.ContextLength, Capabilities: m.Capabilities, Price: m.Price})
			if m.Price != nil {
				prices[m.Name] = *m.Price
			}
		}
		p, err := openai.New(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("models configuration %s: provider %q: %w", path, name, err)
		}
		providers[name] = pj.apply(models.ProviderConfig{Provider: p, Cloud: !pj.Local, Prices: prices})
	}
	r, err := models.NewRouter(models.RouterConfig{
		Providers:  providers,
		Routes:     f.Routes,
		AllowCloud: f.AllowCloud,
		Day:        f.DayBudget,
		Ledger:     ledger,
		Logger:     log.With(logkey.Component, "models"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("models configuration %s: %w", path, err)
	}
	return r, providers, nil
}
