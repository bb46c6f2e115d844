package daemon

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
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelsfile"
	"github.com/keel-runtime/keel/models/ollama"
)

// localProvider is the name modelsfile.Load gives the local provider,
// Ollama (or a test's provider).
const localProvider = modelsfile.LocalName

// providerTimeout bounds asking a provider for its models, so that a
// provider that hangs does not hold up env.describe or models.list.
const providerTimeout = 3 * time.Second

// What to do about the local provider: it did not answer, or it has no
// models.
const (
	hintUnreachable = "start Ollama (`ollama serve`), or point keel at it with OLLAMA_HOST / --ollama-host; without it keel still runs tools directly (`keel tools call`)"
	hintNoModels    = "no models yet: pull one, e.g. `keel models pull qwen2.5:0.5b`"
)

// modelService serves the model methods of the protocol (ipc.Models,
// ipc.Chat) from the model layer.
type modelService struct {
	provider  models.Provider                  // the local one, Ollama unless a test's
	providers map[string]models.ProviderConfig // every configured provider, the local one as localProvider
	router    *models.Router                   // the model layer runs and models.chat use
	endpoint  string                           // the local provider's
	file      string                           // models.json
}

// askProvider asks p, configured under name, for its models, for at most
// providerTimeout. hint says what to do when that fails or finds none;
// local tells the local provider from those of models.json.
func (s *modelService) askProvider(ctx context.Context, name string, p models.Provider, local bool) (list []models.ModelInfo, hint string, err error) {
	ctx, cancel := context.WithTimeout(ctx, providerTimeout)
	defer cancel()
	list, err = p.Models(ctx)
	switch {
	case err != nil && local:
		return nil, hintUnreachable, err
	case err != nil:
		return nil, fmt.Sprintf("check provider %s in %s: that its server runs at base_url and its API key is set (see docs/models.md)", name, s.file), err
	case len(list) == 0 && local:
		return nil, hintNoModels, nil
	case len(list) == 0:
		return nil, fmt.Sprintf("declare the models of provider %s in %s, or set discover (see docs/models.md)", name, s.file), nil
	}
	return list, "", nil
}

// endpointOf returns where the provider configured as name is reached,
// when it says.
func (s *modelService) endpointOf(name string) string {
	if name == localProvider {
		return s.endpoint
	}
	if bu, ok := s.providers[name].Provider.(interface{ BaseURL() string }); ok {
		return bu.BaseURL()
	}
	return ""
}

// capNames spells capabilities as the protocol does.
func capNames(caps []models.Capability) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = string(c)
	}
	return out
}

// ListModels asks every configured provider for its models, all at once,
// and lists them under the names routing uses: local providers first,
// then by name.
func (s *modelService) ListModels(ctx context.Context) (protocol.ModelsListResult, error) {
	names := slices.Collect(maps.Keys(s.providers))
	slices.SortFunc(names, func(x, y string) int {
		if cx, cy := s.providers[x].Cloud, s.providers[y].Cloud; cx != cy {
			if cx {
				return 1
			}
			return -1
		}
		return strings.Compare(x, y)
	})
	type answer struct {
		list []models.ModelInfo
		hint string
		err  error
	}
	answers := make([]answer, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			a := &answers[i]
			a.list, a.hint, a.err = s.askProvider(ctx, name, s.providers[name].Provider, name == localProvider)
		})
	}
	wg.Wait()

	var res protocol.ModelsListResult
	for i, name := range names {
		a := answers[i]
		ps := protocol.ProviderStatus{Name: name, Endpoint: s.endpointOf(name), Reachable: a.err == nil, Hint: a.hint}
		if a.err != nil {
			ps.Error = a.err.Error()
		}
		res.Providers = append(res.Providers, ps)
		for _, m := range a.list {
			res.Models = append(res.Models, protocol.ModelInfo{Name: m.Name, Provider: name, Capabilities: capNames(m.Capabilities),
				ContextLength: m.ContextLength, Size: m.Size, Family: m.Family})
		}
	}
	return res, nil
}

// puller is a provider that can download models (ollama.Provider).
type puller interface {
	Pull(ctx context.Context, name string, progress func(ollama.PullProgress)) error
}

// PullModel pulls a model through the provider, passing its progress on.
// Errors map to the protocol's codes: a name the provider refuses or the
// registry does not know is invalid input; a provider or registry out of
// reach leaves the model unavailable; a pull cut short by the client or
// by shutdown is unavailable.
func (s *modelService) PullModel(ctx context.Context, name string, progress func(protocol.ModelsPullProgress)) error {
	pl, ok := s.provider.(puller)
	if !ok {
		return fmt.Errorf("model provider %s cannot pull models: %w", s.provider.Name(), keel.ErrUnavailable)
	}
	err := pl.Pull(ctx, name, func(p ollama.PullProgress) {
		progress(protocol.ModelsPullProgress{Status: p.Status, Digest: p.Digest, Completed: p.Completed, Total: p.Total})
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("pull of %s cancelled: %w", name, keel.ErrUnavailable)
	case errors.Is(err, models.ErrInvalidRequest), errors.Is(err, models.ErrModelNotFound):
		return fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	}
	return fmt.Errorf("%w: %w", keel.ErrModelUnavailable, err)
}
