package ipc

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// handleConsoleLogin serves console.login: a new one-time code, as a
// URL on the address the client connected to.
func handleConsoleLogin(_ context.Context, c *conn, _ struct{}) (any, error) {
	code, exp := c.s.logins.newCode()
	u := url.URL{Scheme: "http", Host: c.host, Path: protocol.LoginPath, RawQuery: url.Values{"code": {code}}.Encode()}
	c.log.Info("ipc: console login code issued", logkey.Client, c.clientName())
	return protocol.ConsoleLoginResult{URL: u.String(), ExpiresAt: exp.UTC()}, nil
}

// loginFailedPage is the body of a refused login.
const loginFailedPage = `<!doctype html>
<meta charset="utf-8">
<title>keel: login link not valid</title>
<p>This login link is not valid: it was already used, it expired, or the daemon
restarted since it was made. Run <code>keel open</code> again for a new one.</p>
`

// serveLogin exchanges a one-time code (GET /login?code=CODE) for a
// session cookie and redirects to "/" (303), so that the code leaves the
// address bar and the history. A used, expired or unknown code gets
// 401 and a page saying to run `keel open` again. The code is never
// logged.
func (s *Server) serveLogin(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	if r.Method != http.MethodGet {
		// A HEAD (a link preview, a prefetch) must not use up the code.
		h.Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	id, ok := s.logins.redeem(r.URL.Query().Get("code"))
	if !ok {
		s.log.Warn("ipc: login refused", logkey.Remote, r.RemoteAddr, logkey.Reason, "code unknown, used or expired")
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, loginFailedPage)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     s.cookie,
		Value:    id,
		Path:     "/",
		MaxAge:   int(s.cfg.SessionMaxAge.Seconds()),
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
	})
	s.log.Info("ipc: console session started", logkey.Remote, r.RemoteAddr)
	h.Set("Location", "/")
	w.WriteHeader(http.StatusSeeOther)
}

// serveStatus serves protocol.StatusPath: a protocol.Status with 200,
// 401 or 403 as check decides (see docs/protocol.md#status-endpoint).
//
// CORS: the daemon's own pages are same-origin and need none. An
// allowed origin may read the whole answer (Access-Control-Allow-Origin
// is its origin; credentials are the token in an Authorization header,
// never the cookie, so Access-Control-Allow-Credentials is not sent). A
// refused origin may read only that keel is there and refuses it: its
// 403 body carries no version and no data. A preflight (OPTIONS) is
// answered for any origin, since it reveals nothing.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Add("Vary", "Origin")
	origin := r.Header.Get("Origin")
	if origin != "" {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodOptions:
		h.Set("Access-Control-Allow-Methods", "GET")
		h.Set("Access-Control-Allow-Headers", "Authorization")
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return
	default:
		h.Set("Allow", "GET, HEAD, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	who, code := s.check(r)
	st := protocol.Status{Daemon: "keel"}
	switch code {
	case http.StatusForbidden:
		st.Reason = protocol.ReasonOriginRefused
		st.Message = "this page's origin is not allowed to use this keel daemon"
	case http.StatusUnauthorized:
		st.Version, st.Protocol = s.cfg.Version, protocol.Version
		st.Reason = protocol.ReasonLoginRequired
		st.Message = "not logged in, or the session ended: run `keel open` for a new login link"
	default:
		st.Version, st.Protocol = s.cfg.Version, protocol.Version
		st.Authenticated, st.Via, st.Client, st.Scopes = true, who.via, who.name, who.scopes.names()
	}
	body, _ := json.Marshal(st)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

// reasonLoggedOut is the close reason of a connection whose console
// session was ended by a logout.
const reasonLoggedOut = "logged out"

// serveLogout serves protocol.LogoutPath: POST from the daemon's own
// origin ends the session its cookie names (if any: logging out twice
// is no error), closes the connections opened with that session (status
// 1008, "logged out"), clears the cookie and redirects to "/" (303),
// where the console says how to log in again. Any other method is 405;
// a request that does not come from the daemon's own pages (ownPage) is
// 403 and ends nothing, so that no other page, not even one on another
// port of this host, can log the user out.
func (s *Server) serveLogout(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodPost {
		h.Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !ownPage(r) {
		s.log.Warn("ipc: rejected request", logkey.Remote, r.RemoteAddr, logkey.Reason, "logout not from the daemon's own origin")
		http.Error(w, "forbidden: log out from the console's own page", http.StatusForbidden)
		return
	}
	ended := 0
	for _, c := range r.CookiesNamed(s.cookie) {
		if id, ok := s.logins.end(c.Value); ok {
			for _, cc := range s.connsOfSession(id) {
				cc.end(websocket.StatusPolicyViolation, reasonLoggedOut)
			}
			ended++
		}
	}
	if ended > 0 {
		s.log.Info("ipc: console session ended by logout", logkey.Remote, r.RemoteAddr)
	}
	http.SetCookie(w, &http.Cookie{
		Name:     s.cookie,
		Value:    "",
		Path:     "/",
		MaxAge:   -1, // Max-Age=0: the browser drops it
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
	})
	h.Set("Location", "/")
	w.WriteHeader(http.StatusSeeOther)
}

// connsOfSession returns the open connections of console session id.
func (s *Server) connsOfSession(id secretHash) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*conn
	for c := range s.conns {
		if c.who.via == viaSession && c.who.session == id {
			out = append(out, c)
		}
	}
	return out
}

// ownPage reports whether r, a request that changes something, comes
// from one of the daemon's own pages: its Origin is the daemon's own,
// or it is "null" or absent (a form posted from a page whose
// Referrer-Policy is no-referrer, as the console's is, carries
// "Origin: null") and the browser says Sec-Fetch-Site: same-origin,
// which a page cannot forge. A page on another port of the host is
// same-site, not same-origin.
func ownPage(r *http.Request) bool {
	origins := r.Header.Values("Origin")
	switch {
	case len(origins) > 1:
		return false
	case len(origins) == 1 && strings.ToLower(origins[0]) == ownOrigin(r):
		return true
	case len(origins) == 0 || origins[0] == "null":
		return r.Header.Get("Sec-Fetch-Site") == "same-origin"
	}
	return false
}
