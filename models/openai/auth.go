package openai

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/zalando/go-keyring"

	"github.com/keel-runtime/keel/models"
)

// keySource finds the API key of each call: the environment variable, else
// the OS keyring. It is safe for concurrent use.
type keySource struct {
	env           string
	service, user string
	get           func(service, user string) (string, error) // keyring.Get; replaced by tests
	timeout       time.Duration

	mu     sync.Mutex
	cached string  // the key last read from the keyring
	flight *lookup // the keyring lookup in flight, if any
}

// lookup is one keyring read; done is closed once key and err are set.
type lookup struct {
	done chan struct{}
	key  string
	err  error
}

// key returns the API key for a call on model, "" when none is configured
// (a local server), or an error of KindAuth saying where to put the key.
// Nothing has been sent when it fails.
func (k *keySource) key(ctx context.Context, p *Provider, model string) (string, error) {
	if k.env != "" {
		if v := strings.TrimSpace(os.Getenv(k.env)); v != "" {
			return v, nil
		}
	}
	if k.service == "" {
		if k.env == "" {
			return "", nil
		}
		return "", p.errorf(models.KindAuth, model, nil,
			"no API key: set the environment variable %s to the API key for %s", k.env, p.BaseURL())
	}
	key, err := k.fromKeyring(ctx)
	if err == nil {
		return key, nil
	}
	if ctx.Err() != nil {
		return "", p.ctxError(model, ctx.Err())
	}
	envUnset := ""
	if k.env != "" {
		envUnset = fmt.Sprintf("the environment variable %s is unset and ", k.env)
	}
	switch {
	case errors.Is(err, keyring.ErrNotFound):
		return "", p.errorf(models.KindAuth, model, nil,
			"no API key: %sthe OS keyring has no secret for service %q, user %q: store the key for %s there",
			envUnset, k.service, k.user, p.BaseURL())
	case errors.Is(err, context.DeadlineExceeded):
		return "", p.errorf(models.KindAuth, model, nil,
			"no API key: %sthe OS keyring did not answer within %v (locked, waiting for a password prompt?)",
			envUnset, k.timeout)
	default:
		return "", p.errorf(models.KindAuth, model, err,
			"no API key: %sthe OS keyring is unavailable: start a keyring service (Secret Service on Linux) or set the key in an environment variable",
			envUnset)
	}
}

// fromKeyring returns the cached key or reads it from the keyring, giving
// up after k.timeout or when ctx ends. At most one read is in flight: the
// keyring API cannot be cancelled, so a read that hangs is left to finish
// on its own goroutine, and later calls wait for that same read.
func (k *keySource) fromKeyring(ctx context.Context) (string, error) {
	k.mu.Lock()
	if k.cached != "" {
		key := k.cached
		k.mu.Unlock()
		return key, nil
	}
	l := k.flight
	if l == nil {
		l = &lookup{done: make(chan struct{})}
		k.flight = l
		go func() {
			key, err := k.get(k.service, k.user)
			key = strings.TrimSpace(key)
			if err == nil && key == "" {
				err = keyring.ErrNotFound
			}
			k.mu.Lock()
			l.key, l.err = key, err
			if err == nil {
				k.cached = key
			}
			k.flight = nil
			k.mu.Unlock()
			close(l.done)
		}()
	}
	k.mu.Unlock()

	t := time.NewTimer(k.timeout)
	defer t.Stop()
	select {
	case <-l.done:
		return l.key, l.err
	case <-t.C:
		return "", context.DeadlineExceeded
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// forget drops key from the cache after the server refused it, so the
// next call reads the keyring again.
func (k *keySource) forget(key string) {
	k.mu.Lock()
	if k.cached == key {
		k.cached = ""
	}
	k.mu.Unlock()
}

// describe says where the key comes from, for messages.
func (k *keySource) describe() string {
	where := fmt.Sprintf("the OS keyring (service %q, user %q)", k.service, k.user)
	switch {
	case k.env != "" && k.service != "":
		return fmt.Sprintf("the API key from $%s or %s", k.env, where)
	case k.env != "":
		return "the API key in $" + k.env
	case k.service != "":
		return "the API key in " + where
	}
	return ""
}

// redact removes key from s: servers echo a refused key in their message.
func redact(s, key string) string {
	if key == "" {
		return s
	}
	return strings.ReplaceAll(s, key, "[redacted]")
}
