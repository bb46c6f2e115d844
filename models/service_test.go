package models_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// modelLog is a model interceptor that records what it sees and denies
// when told to.
type modelLog struct {
	deny   bool
	mu     sync.Mutex
	before []keel.ModelInvocation
	after  []intercept.ModelOutcome
}

func (l *modelLog) BeforeModel(_ context.Context, inv keel.ModelInvocation) intercept.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.before = append(l.before, inv)
	return intercept.Decision{Deny: l.deny, Reason: "not this one", By: "test"}
}

func (l *modelLog) AfterModel(_ context.Context, _ keel.ModelInvocation, _ intercept.Decision, o intercept.ModelOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.after = append(l.after, o)
}

// TestServiceChatPassesInterceptors: a direct models.chat passes the
// model interceptors as a run's calls do: seen before and after with its
// outcome, and a denied call reaches no model and is refused as invalid.
func TestServiceChatPassesInterceptors(t *testing.T) {
	t.Parallel()
	for _, deny := range []bool{false, true} {
		p := scripted.New([]models.ModelInfo{{Name: "m"}}, scripted.Repeat(scripted.Answer("hello")))
		r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: p}}})
		if err != nil {
			t.Fatal(err)
		}
		log := &modelLog{deny: deny}
		s := models.NewService(models.ServiceConfig{Router: r, Local: "local", Interceptors: intercept.Models{log}})
		reply, err := s.Chat(context.Background(), keel.ChatRequest{Model: "local/m",
			Messages: []keel.ChatMessage{{Role: "user", Content: "hi"}}}, nil)
		if len(log.before) != 1 || log.before[0].Model != "local/m" || log.before[0].Run != "" || len(log.after) != 1 {
			t.Fatalf("deny=%v: the interceptor saw before %+v, after %d outcomes; want one direct call of local/m each", deny, log.before, len(log.after))
		}
		if deny {
			if !errors.Is(err, keel.ErrInvalid) || !errors.Is(err, intercept.ErrDenied) {
				t.Errorf("denied chat: %v; want an invalid request wrapping intercept.ErrDenied", err)
			}
			if n := len(p.Requests()); n != 0 {
				t.Errorf("denied chat reached the model %d times", n)
			}
			continue
		}
		if err != nil || reply.Message.Content != "hello" {
			t.Fatalf("allowed chat: %+v, %v", reply, err)
		}
		if o := log.after[0]; o.Err != nil || o.Provider != "local" {
			t.Errorf("allowed chat's outcome: %+v; want no error, provider local", o)
		}
	}
}
