package protocol

import (
	"time"

	"github.com/keel-runtime/keel"
)

// Methods of the console login and of client tokens; each needs the
// admin scope.
const (
	// MethodConsoleLogin asks for a one-time login link to the daemon's
	// web console (docs/protocol.md#consolelogin).
	MethodConsoleLogin = "console.login"
	MethodTokenCreate  = "token.create"
	MethodTokenList    = "token.list"
	MethodTokenRevoke  = "token.revoke"
)

// ForbiddenData is the data of a CodeForbidden error.
type ForbiddenData struct {
	Method string `json:"method"`
	Scope  string `json:"scope"` // the scope the method needs
}

// TokenInfo is a client token as token.list shows it: never its secret.
type TokenInfo = keel.ClientToken

// TokenCreateParams creates a client token.
type TokenCreateParams struct {
	// Name names the token in token.list and token.revoke: 1 to 64 of
	// a-z, 0-9, ".", "_" and "-", starting with a letter or digit.
	Name string `json:"name"`
	// Scopes are what the token may do (keel.ScopeRead, ...): at least
	// one, none the caller lacks.
	Scopes []string `json:"scopes"`
	// Origins are origin patterns of browser pages that may use the
	// token, beside the daemon's allowed origins (docs/protocol.md#origin-patterns).
	Origins []string `json:"origins,omitempty"`
	// ExpiresAt, if set, is when the token stops working; it must be in
	// the future.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// TokenCreateResult is the result of token.create: the secret, shown
// this once, and the token as token.list will show it.
type TokenCreateResult struct {
	Token string    `json:"token"`
	Info  TokenInfo `json:"info"`
}

// TokenListResult is the result of token.list, by name.
type TokenListResult struct {
	Tokens []TokenInfo `json:"tokens"`
}

// TokenRevokeParams names the token to revoke.
type TokenRevokeParams struct {
	Name string `json:"name"`
}

// TokenRevokeResult is the result of token.revoke.
type TokenRevokeResult struct {
	// Closed counts the connections that used the token, which the
	// daemon closes (status 1008, "token revoked").
	Closed int `json:"closed"`
}

// LoginPath is the path of the daemon's login page: GET
// LoginPath?code=CODE exchanges a one-time code from console.login for a
// session cookie and redirects to "/".
const LoginPath = "/login"

// LogoutPath is the path that ends a console session: POST LogoutPath
// from the daemon's own origin ends the session its cookie names, closes
// the connections opened with it, clears the cookie and redirects to
// "/" (303).
const LogoutPath = "/logout"

// StatusPath is the path of the daemon's status endpoint: GET StatusPath
// answers a Status, with 200 when the request's credentials are good,
// 401 when they are missing or no longer good and 403 when its Origin is
// refused. A page uses it to tell "log in again" from "this page's
// origin is not allowed" from "the daemon is down" (a network error).
const StatusPath = "/v1/status"

// SessionCookiePrefix starts the name of the console's session cookie;
// the daemon's port follows ("keel_session_7433"), so that two daemons
// on one host do not overwrite each other's session (browsers share
// cookies across the ports of a host).
const SessionCookiePrefix = "keel_session_"

// ConsoleLoginResult is the result of console.login.
type ConsoleLoginResult struct {
	// URL opens the console logged in, once: the daemon's own address
	// as the client reached it, LoginPath and the code, such as
	// "http://127.0.0.1:7433/login?code=…".
	URL string `json:"url"`
	// ExpiresAt is when the code stops working if it is not used.
	ExpiresAt time.Time `json:"expires_at"`
}

// Status is the body of the status endpoint (StatusPath).
type Status struct {
	// Daemon is always "keel".
	Daemon string `json:"daemon"`
	// Version and Protocol are the daemon's version and protocol
	// version; empty when the request's Origin is refused.
	Version  string `json:"version,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	// Authenticated reports whether the request's credentials are good.
	Authenticated bool `json:"authenticated"`
	// Via is the credential that authenticated the request: "token"
	// (the daemon's own), "client_token" or "session"; empty when not
	// authenticated.
	Via string `json:"via,omitempty"`
	// Client is the name of the client token, for Via "client_token".
	Client string `json:"client,omitempty"`
	// Scopes are what the credential may do (keel.ScopeRead, ...).
	Scopes []string `json:"scopes,omitempty"`
	// Reason says why the request is not authenticated: one of the
	// Reason constants; empty when it is.
	Reason string `json:"reason,omitempty"`
	// Message says the same for a person, with what to do.
	Message string `json:"message,omitempty"`
}

// Reasons of a Status that is not authenticated.
const (
	// ReasonLoginRequired (HTTP 401): no credentials, a wrong token, or
	// a session that expired or that the daemon no longer knows (it
	// restarted). A console page asks the user to run `keel open`.
	ReasonLoginRequired = "login_required"
	// ReasonOriginRefused (HTTP 403): the request's Origin is neither the
	// daemon's own nor an allowed one. Nothing else is disclosed.
	ReasonOriginRefused = "origin_refused"
)
