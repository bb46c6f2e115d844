package ipc

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"time"
)

// Defaults of the console login (Config).
const (
	defaultLoginCodeTTL  = 60 * time.Second
	defaultSessionIdle   = 12 * time.Hour
	defaultSessionMaxAge = 7 * 24 * time.Hour
	maxOutstandingCodes  = 16
	maxSessions          = 64
	secretBytes          = 32  // 256 bits for codes and session IDs
	maxSecretLen         = 128 // longer codes and cookies are not looked up
)

// secretHash is the SHA-256 of a code or session ID: the server keeps
// only these, and looks secrets up by their hash, so that neither a
// memory dump nor a timing difference in the lookup gives a secret
// away (the attacker does not choose the hash's bytes).
type secretHash [sha256.Size]byte

func hashSecret(s string) secretHash { return sha256.Sum256([]byte(s)) }

// newSecret returns 256 random bits, base64url-encoded without padding
// (43 characters, safe in a URL and a cookie).
func newSecret() string {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}

// logins holds the console's outstanding one-time login codes and its
// sessions, both in memory only: a daemon restart ends every session.
// It is safe for concurrent use.
type logins struct {
	now     func() time.Time
	codeTTL time.Duration
	idle    time.Duration
	maxAge  time.Duration

	mu       sync.Mutex
	codes    map[secretHash]time.Time // code → expiry
	sessions map[secretHash]*session
}

// session is one console session.
type session struct {
	created  time.Time
	lastUsed time.Time
}

func newLogins(cfg Config) *logins {
	return &logins{
		now:      cfg.Now,
		codeTTL:  cfg.LoginCodeTTL,
		idle:     cfg.SessionIdleTimeout,
		maxAge:   cfg.SessionMaxAge,
		codes:    make(map[secretHash]time.Time),
		sessions: make(map[secretHash]*session),
	}
}

// newCode returns a new one-time code and its expiry. When
// maxOutstandingCodes are outstanding, the one that expires first is
// dropped: a user who runs `keel open` again always gets a working link.
func (l *logins) newCode() (string, time.Time) {
	code := newSecret()
	now := l.now()
	exp := now.Add(l.codeTTL)
	l.mu.Lock()
	defer l.mu.Unlock()
	for h, e := range l.codes {
		if !now.Before(e) {
			delete(l.codes, h)
		}
	}
	if len(l.codes) >= maxOutstandingCodes {
		var oldest secretHash
		first := true
		for h, e := range l.codes {
			if first || e.Before(l.codes[oldest]) {
				oldest, first = h, false
			}
		}
		delete(l.codes, oldest)
	}
	l.codes[hashSecret(code)] = exp
	return code, exp
}

// redeem consumes code and, if it was outstanding and has not expired,
// starts a session and returns its ID. A code works once, whatever the
// outcome.
func (l *logins) redeem(code string) (sessionID string, ok bool) {
	if code == "" || len(code) > maxSecretLen {
		return "", false
	}
	h := hashSecret(code)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	exp, found := l.codes[h]
	delete(l.codes, h)
	if !found || !now.Before(exp) {
		return "", false
	}
	l.pruneSessions(now)
	if len(l.sessions) >= maxSessions {
		var lru secretHash
		first := true
		for h, s := range l.sessions {
			if first || s.lastUsed.Before(l.sessions[lru].lastUsed) {
				lru, first = h, false
			}
		}
		delete(l.sessions, lru)
	}
	id := newSecret()
	l.sessions[hashSecret(id)] = &session{created: now, lastUsed: now}
	return id, true
}

// use reports whether id is a live session and, if so, marks it used
// now (which restarts its idle timeout) and returns its hash, which
// names it to end.
func (l *logins) use(id string) (secretHash, bool) {
	if id == "" || len(id) > maxSecretLen {
		return secretHash{}, false
	}
	h := hashSecret(id)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.sessions[h]
	if !ok {
		return secretHash{}, false
	}
	if l.expired(s, now) {
		delete(l.sessions, h)
		return secretHash{}, false
	}
	s.lastUsed = now
	return h, true
}

// end ends session id (a logout) and returns its hash; false if it was
// not a session (unknown, or already ended).
func (l *logins) end(id string) (secretHash, bool) {
	if id == "" || len(id) > maxSecretLen {
		return secretHash{}, false
	}
	h := hashSecret(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.sessions[h]
	delete(l.sessions, h)
	return h, ok
}

func (l *logins) expired(s *session, now time.Time) bool {
	return !now.Before(s.lastUsed.Add(l.idle)) || !now.Before(s.created.Add(l.maxAge))
}

// pruneSessions drops expired sessions; l.mu is held.
func (l *logins) pruneSessions(now time.Time) {
	for h, s := range l.sessions {
		if l.expired(s, now) {
			delete(l.sessions, h)
		}
	}
}
