package ipc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// clientTokenPrefix starts every client token's secret, so that a
// leaked one is recognisable (secret scanners, logs).
const clientTokenPrefix = "keel_ct_"

// touchEvery is how stale a client token's last use may be before a new
// use is written to the store.
const touchEvery = time.Minute

// reasonTokenRevoked is the close reason of a revoked token's
// connections.
const reasonTokenRevoked = "token revoked"

var tokenName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// tokenCaller returns the caller of the first token r presents that is
// the daemon's own or a live client token.
func (s *Server) tokenCaller(r *http.Request) (caller, bool) {
	for _, tok := range PresentedTokens(r) {
		if s.tokenMatches(tok) {
			return caller{via: viaToken, scopes: allScopes}, true
		}
		if who, ok := s.clientToken(r.Context(), tok, r.RemoteAddr); ok {
			return who, true
		}
	}
	return caller{}, false
}

// clientToken looks tok up among the client tokens. Tokens are looked
// up by their SHA-256, so the lookup's timing tells nothing about the
// secret.
func (s *Server) clientToken(ctx context.Context, tok, remote string) (caller, bool) {
	if s.svc.Tokens == nil || !strings.HasPrefix(tok, clientTokenPrefix) || len(tok) > maxSecretLen {
		return caller{}, false
	}
	sum := sha256.Sum256([]byte(tok))
	t, err := s.svc.Tokens.ClientTokenBySHA256(ctx, hex.EncodeToString(sum[:]))
	if err != nil {
		if !errors.Is(err, keel.ErrNotFound) {
			s.log.Error("ipc: look up client token", logkey.Err, err)
		}
		return caller{}, false
	}
	now := s.cfg.Now()
	if !t.Expires.IsZero() && !now.Before(t.Expires) {
		s.log.Warn("ipc: rejected request", logkey.Remote, remote, logkey.Client, t.Name, logkey.Reason, "client token expired")
		return caller{}, false
	}
	scopes, err := parseScopes(t.Scopes)
	if err != nil {
		s.log.Error("ipc: client token", logkey.Client, t.Name, logkey.Err, err)
		return caller{}, false
	}
	origins, err := parseOriginPatterns(t.Origins)
	if err != nil {
		s.log.Error("ipc: client token", logkey.Client, t.Name, logkey.Err, err)
		origins = nil
	}
	if now.Sub(t.LastUsed) >= touchEvery {
		if err := s.svc.Tokens.TouchClientToken(ctx, t.Name, now); err != nil {
			s.log.Warn("ipc: record client token use", logkey.Client, t.Name, logkey.Err, err)
		}
	}
	return caller{via: viaClientToken, name: t.Name, scopes: scopes, origins: origins}, true
}

func handleTokenCreate(ctx context.Context, c *conn, p protocol.TokenCreateParams) (any, error) {
	if !tokenName.MatchString(p.Name) {
		return nil, paramError("name", "want 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit")
	}
	if len(p.Scopes) == 0 {
		return nil, paramError("scopes", fmt.Sprintf("name at least one of %v", keel.Scopes))
	}
	scopes, err := parseScopes(p.Scopes)
	if err != nil {
		return nil, paramError("scopes", err.Error())
	}
	// A token never gets more than its maker has.
	for _, sc := range scopes.names() {
		if !c.who.scopes.has(sc) {
			return nil, forbidden(protocol.MethodTokenCreate+" of a token with scope "+sc, sc)
		}
	}
	for _, o := range p.Origins {
		if _, err := parseOriginPattern(o); err != nil {
			return nil, paramError("origins", err.Error())
		}
	}
	now := c.s.cfg.Now()
	if !p.ExpiresAt.IsZero() && !p.ExpiresAt.After(now) {
		return nil, paramError("expires_at", "must be in the future")
	}
	secret := clientTokenPrefix + newSecret()
	sum := sha256.Sum256([]byte(secret))
	t := keel.ClientToken{
		Name:    p.Name,
		SHA256:  hex.EncodeToString(sum[:]),
		Scopes:  scopes.names(),
		Origins: nonNil(p.Origins),
		Created: now.UTC(),
		Expires: p.ExpiresAt.UTC(),
	}
	if p.ExpiresAt.IsZero() {
		t.Expires = time.Time{}
	}
	if err := c.s.svc.Tokens.CreateClientToken(ctx, t); err != nil {
		if errors.Is(err, keel.ErrConflict) {
			return nil, &protocol.Error{Code: protocol.CodeConflict, Message: fmt.Sprintf("a client token named %q exists; revoke it first or pick another name", p.Name)}
		}
		return nil, err
	}
	c.log.Info("ipc: client token created", logkey.Client, t.Name)
	return protocol.TokenCreateResult{Token: secret, Info: t}, nil
}

func handleTokenList(ctx context.Context, c *conn, _ struct{}) (any, error) {
	ts, err := c.s.svc.Tokens.ClientTokens(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ts {
		ts[i].Scopes, ts[i].Origins = nonNil(ts[i].Scopes), nonNil(ts[i].Origins)
	}
	return protocol.TokenListResult{Tokens: nonNil(ts)}, nil
}

func handleTokenRevoke(ctx context.Context, c *conn, p protocol.TokenRevokeParams) (any, error) {
	if p.Name == "" {
		return nil, paramError("name", "must not be empty")
	}
	if err := c.s.svc.Tokens.DeleteClientToken(ctx, p.Name); err != nil {
		return nil, err
	}
	c.log.Info("ipc: client token revoked", logkey.Client, p.Name)
	conns := c.s.connsOf(p.Name)
	// Closed after the response is queued: a token may revoke itself.
	return followUp{
		result: protocol.TokenRevokeResult{Closed: len(conns)},
		then: func() {
			for _, cc := range conns {
				cc.end(websocket.StatusPolicyViolation, reasonTokenRevoked)
			}
		},
	}, nil
}

// connsOf returns the open connections of the client token name.
func (s *Server) connsOf(name string) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*conn
	for c := range s.conns {
		if c.who.via == viaClientToken && c.who.name == name {
			out = append(out, c)
		}
	}
	return out
}
