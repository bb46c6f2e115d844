package ollama

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// PullProgress is one progress report of a pull, as Ollama streams it
// (see keel.PullProgress for what Status says); an alias, so that the
// provider satisfies models.Puller.
type PullProgress = keel.PullProgress

// Texts of the errors Ollama v0.17.4 streams when it cannot get a model's
// manifest from the registry (server/images.go, PullModel). The
// registry's 404 reaches it as os.ErrNotExist, hence "file does not
// exist".
const (
	manifestErrPrefix = "pull model manifest: "
	manifestNotFound  = manifestErrPrefix + "file does not exist"
)

// Pull downloads the model name from Ollama's registry into the Ollama
// server (/api/pull) and returns once the model is complete. progress,
// when not nil, is called from the calling goroutine with each report
// Ollama streams, in order. Cancelling ctx cancels the pull and returns an
// error wrapping ctx.Err(). After a pull, Show and Models see the model
// as pulled, without waiting for their cache to expire.
//
// Errors are *models.Error values. A name that is not a valid model name
// by Ollama's own rules is refused before Ollama is contacted
// (models.ErrInvalidRequest); the registry may have no such model
// (models.ErrModelNotFound); Ollama may be out of reach, unable to reach
// its registry, or fail part way (models.ErrUnavailable). Each message
// says what to do.
func (p *Provider) Pull(ctx context.Context, name string, progress func(PullProgress)) error {
	if !model.ParseName(name).IsValid() {
		return &models.Error{Kind: models.KindInvalidRequest, Provider: p.Name(), Model: name,
			Msg: "pull: not a valid model name; names look like qwen2.5:0.5b or NAMESPACE/MODEL:TAG"}
	}
	success := false
	err := p.client.Pull(ctx, &api.PullRequest{Model: name}, func(r api.ProgressResponse) error {
		if r.Status == "success" {
			success = true
		}
		if progress != nil {
			progress(PullProgress{Status: r.Status, Digest: r.Digest, Completed: r.Completed, Total: r.Total})
		}
		return nil
	})
	switch {
	case ctx.Err() != nil:
		return p.wrap(ctx, "pull", name, err)
	case err != nil:
		return p.pullError(ctx, name, err)
	case !success:
		// The api client ends a stream cut short without an error.
		return &models.Error{Kind: models.KindNetwork, Provider: p.Name(), Model: name,
			Msg: fmt.Sprintf("pull: the reply from Ollama at %s ended before the pull completed; see Ollama's server log and pull again", p.Endpoint())}
	}
	p.forgetShow(name)
	return nil
}

// pullError classifies an error of the api client's Pull.
func (p *Provider) pullError(ctx context.Context, name string, err error) error {
	var (
		se api.StatusError
		ae api.AuthorizationError
		ue *url.Error
	)
	if errors.As(err, &se) || errors.As(err, &ae) || errors.As(err, &ue) {
		// Ollama down, or the request refused before the pull began
		// (a 400 for a name Ollama will not pull).
		return p.wrap(ctx, "pull", name, err)
	}
	// What goes wrong once the pull has begun is streamed as
	// {"error": "..."} and reaches us as a bare string: only its text
	// tells the cases apart.
	e := &models.Error{Kind: models.KindUnknown, Provider: p.Name(), Model: name, Err: err,
		Msg: "pull: the pull failed part way; pull again to resume it"}
	switch msg := err.Error(); {
	case msg == manifestNotFound:
		e.Kind, e.Msg = models.KindNotFound, "pull: the registry has no model of that name; check the name and tag at https://ollama.com/search"
	case strings.HasPrefix(msg, manifestErrPrefix):
		e.Kind, e.Msg = models.KindNetwork, fmt.Sprintf("pull: Ollama at %s could not get the model from its registry: check that machine's internet connection and proxy settings (HTTPS_PROXY in Ollama's environment), or try again later", p.Endpoint())
	}
	return e
}

// forgetShow drops the cached /api/show results of a model just pulled,
// which may have replaced the model of that name. The cache is keyed by
// the name as callers spelled it, with or without ":latest".
func (p *Provider) forgetShow(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.shows, name)
	delete(p.shows, strings.TrimSuffix(name, ":latest"))
	delete(p.shows, name+":latest")
	delete(p.digests, modelKey(name))
}
