package ipc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Config configures a Server. Token is required; the zero value of every
// other field selects a safe default.
type Config struct {
	// Token is the secret every client must present, either as
	// "Authorization: Bearer TOKEN" or, for browsers, as the WebSocket
	// subprotocol protocol.TokenSubprotocolPrefix+TOKEN. Required.
	Token string
	// AllowedOrigins lists the origins whose pages may connect with a
	// token: exact origins (scheme://host[:port], as a browser sends
	// them, such as "http://localhost:5173") or patterns with a wildcard
	// port ("http://localhost:*"), leading host label
	// ("https://*.example.com") or, for schemes other than http and
	// https, host ("vscode-webview://*"); see docs/protocol.md. By
	// default no other origin is allowed: only the daemon's own pages
	// (with a session) and clients that send no Origin header (native
	// programs) can connect.
	AllowedOrigins []string
	// AllowedHosts lists the Host header values requests may carry
	// beside the loopback names (127.0.0.1, localhost, [::1]) with the
	// listener's port and the address it is bound to: the names a server
	// reached from other machines is known by. An entry "HOST:PORT"
	// allows exactly that; "HOST" allows HOST with the listener's port
	// or with none (the scheme's default port, as behind a proxy on 443).
	// Names compare case-insensitively. A request with any other Host is
	// refused (403), which stops DNS rebinding. Default: none, loopback
	// only.
	AllowedHosts []string
	// Logger receives the server's log: rejected handshakes and dropped
	// clients at Warn, unexpected errors (with the detail clients do not
	// get) at Error. Default: logs are discarded.
	Logger *slog.Logger
	// QueueSize bounds, per client: the queued live event notifications,
	// the queued responses and replayed events (separately), and the live
	// events a subscription buffers while it replays history. A client
	// whose live events overflow is disconnected; responses and replayed
	// events wait for room instead. Default 256.
	QueueSize int
	// Version is the server version reported by initialize. Default "dev".
	Version string
	// Routes are HTTP handlers the server serves beside the protocol's
	// WebSocket path (the web console's pages, the metrics endpoint, and
	// later bridges). Every request, to a route or not, must carry an
	// allowed Host header (DNS rebinding). Default: none; any other path
	// is 404. The server serves protocol.LoginPath and
	// protocol.StatusPath itself.
	Routes []Route
	// LoginCodeTTL is how long a console.login code works if it is not
	// used. Default 60 s.
	LoginCodeTTL time.Duration
	// SessionIdleTimeout ends a console session that has not been used
	// (no connection, route or status request) for this long. Default
	// 12 h.
	SessionIdleTimeout time.Duration
	// SessionMaxAge ends a console session this long after its login,
	// used or not. Default 7 days.
	SessionMaxAge time.Duration
	// Now is the clock of login codes and sessions. Default time.Now.
	Now func() time.Time
}

// Route is one extra HTTP handler of a Server.
type Route struct {
	// Pattern is an http.ServeMux pattern, such as "GET /metrics" or
	// "GET /console/". It must not overlap protocol.Path.
	Pattern string
	// Handler serves the requests that match Pattern.
	Handler http.Handler
	// Public routes are served without credentials: only static content
	// that holds no data (the console's pages) may be public. Every other
	// route requires the same credentials and Origin check as the
	// WebSocket, and answers 401 or 403 as it does.
	Public bool
}

const (
	defaultQueueSize = 256
	// maxInFlight bounds the requests one connection may have running at
	// once; the connection is not read while it is reached.
	maxInFlight = 64
	// shutdownGrace is how long Run waits for clients to finish the
	// close handshake before it closes their connections outright.
	shutdownGrace = 2 * time.Second
	// maxListLimit is the largest limit run.list accepts.
	maxListLimit = 1000
	// defaultListLimit is run.list's limit when none is given.
	defaultListLimit = 50
)

// reasonTooSlow is the close reason of a client whose queue overflowed.
const reasonTooSlow = "client too slow: event queue full"

// Server serves the keel protocol over WebSocket on a loopback listener.
// Create it with NewServer and serve with Run. Its methods are safe for
// concurrent use.
type Server struct {
	svc     Services
	cfg     Config
	served  map[string]methodFunc // the methods of the groups svc serves
	log     *slog.Logger
	token   [sha256.Size]byte
	origins originPatterns // Config.AllowedOrigins
	mux     *http.ServeMux // see routes
	logins  *logins
	watch   *runWatch // runs.subscribe
	// cookie is the name of the session cookie, set by Run before it
	// serves (it holds the port).
	cookie string

	ran atomic.Bool

	mu      sync.Mutex
	closing bool
	conns   map[*conn]struct{}
	connWG  sync.WaitGroup
}

// NewServer returns a server that serves the groups of svc that are not
// nil. It fails if cfg.Token is empty or an allowed origin is not of the
// form scheme://host[:port].
func NewServer(svc Services, cfg Config) (*Server, error) {
	if cfg.Token == "" {
		return nil, errors.New("ipc: Config.Token is required")
	}
	origins, err := parseOriginPatterns(cfg.AllowedOrigins)
	if err != nil {
		return nil, fmt.Errorf("ipc: allowed origin: %w", err)
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = defaultQueueSize
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.LoginCodeTTL <= 0 {
		cfg.LoginCodeTTL = defaultLoginCodeTTL
	}
	if cfg.SessionIdleTimeout <= 0 {
		cfg.SessionIdleTimeout = defaultSessionIdle
	}
	if cfg.SessionMaxAge <= 0 {
		cfg.SessionMaxAge = defaultSessionMaxAge
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.AllowedOrigins = append([]string(nil), cfg.AllowedOrigins...)
	cfg.AllowedHosts = append([]string(nil), cfg.AllowedHosts...)
	for _, h := range cfg.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/ *@") {
			return nil, fmt.Errorf("ipc: allowed host %q: want HOST or HOST:PORT", h)
		}
	}
	cfg.Routes = append([]Route(nil), cfg.Routes...)
	for _, rt := range cfg.Routes {
		if rt.Handler == nil || rt.Pattern == "" {
			return nil, fmt.Errorf("ipc: route %q: pattern and handler are required", rt.Pattern)
		}
	}
	s := &Server{
		svc:     svc,
		cfg:     cfg,
		served:  servedMethods(svc),
		log:     log,
		token:   sha256.Sum256([]byte(cfg.Token)),
		origins: origins,
		logins:  newLogins(cfg),
		conns:   make(map[*conn]struct{}),
	}
	mux, err := s.routes()
	if err != nil {
		return nil, err
	}
	s.mux = mux
	s.watch = newRunWatch(s)
	return s, nil
}

// routes builds the server's request router: the protocol's path and
// cfg.Routes. A pattern that is malformed or conflicts with another is an
// error (http.ServeMux would panic).
func (s *Server) routes() (mux *http.ServeMux, err error) {
	defer func() {
		if r := recover(); r != nil {
			mux, err = nil, fmt.Errorf("ipc: routes: %v", r)
		}
	}()
	mux = http.NewServeMux()
	mux.Handle(protocol.Path, s.guard(s.serveWebSocket()))
	mux.Handle("GET "+protocol.LoginPath, http.HandlerFunc(s.serveLogin))
	mux.Handle(protocol.LogoutPath, http.HandlerFunc(s.serveLogout))
	mux.Handle(protocol.StatusPath, http.HandlerFunc(s.serveStatus))
	for _, rt := range s.cfg.Routes {
		h := rt.Handler
		if !rt.Public {
			h = s.guard(h)
		}
		mux.Handle(rt.Pattern, h)
	}
	return mux, nil
}

// CheckOrigins reports the first of origins that NewServer would refuse
// as Config.AllowedOrigins (wrapping ErrOriginPattern), so that a
// composition root can reject a bad flag before any slow work.
func CheckOrigins(origins []string) error {
	_, err := parseOriginPatterns(origins)
	return err
}

// URL returns the WebSocket URL clients use to reach a server listening
// on ln, such as "ws://127.0.0.1:PORT/v1/ws". A listener bound to all
// interfaces is reached through 127.0.0.1.
func (s *Server) URL(ln net.Listener) string {
	host := "127.0.0.1"
	port := ""
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		if a.IP != nil && !a.IP.IsUnspecified() {
			host = a.IP.String()
		}
		port = strconv.Itoa(a.Port)
	} else if h, p, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		host, port = h, p
	}
	return "ws://" + net.JoinHostPort(host, port) + protocol.Path
}

// Run serves on ln, which must be a TCP listener (normally bound to a
// loopback address) or a TLS listener over one (tls.NewListener: the
// server then speaks wss:// and https://), until ctx is done or ln
// fails, then closes ln and every client connection (with status 1001,
// "server shutting down") and returns once every goroutine it started
// has exited, including every Services call in flight. It returns nil
// after ctx is done. A Server runs once (Run or Handler); a second Run
// fails.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	h, stop, err := s.Handler(ln.Addr())
	if err != nil {
		ln.Close()
		return err
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnContext:       ConnContext,
	}
	s.log.Info("ipc: serving", logkey.Addr, ln.Addr().String())

	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()

	var runErr error
	served := false
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("ipc: serve: %w", err)
		served = true
	}

	// Stop accepting and finish plain HTTP requests (rejections). Shutdown
	// does not wait for upgraded connections; stop does.
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	cancel()
	if !served {
		<-serveErr
	}
	stop()
	return runErr
}

// Handler starts the server for serving inside an http.Server of the
// caller's (whose ConnContext must be ConnContext), listening on addr
// (a TCP address: the Host names allowed and the session cookie's name
// come from it), and returns its handler: for a composition root that
// serves several Servers behind one listener (the cloud's tenants, each
// a Server with its own token and Services). It starts what Run starts before it serves; stop, called
// once the caller's http.Server no longer accepts requests, closes
// every connection the handler upgraded and returns once every
// goroutine the server started has exited. A Server serves once (Run or
// Handler).
func (s *Server) Handler(addr net.Addr) (h http.Handler, stop func(), err error) {
	if s.ran.Swap(true) {
		return nil, nil, errors.New("ipc: a Server serves once (Run or Handler)")
	}
	hosts, err := allowedHosts(addr, s.cfg.AllowedHosts)
	if err != nil {
		return nil, nil, err
	}
	s.cookie = protocol.SessionCookiePrefix + strconv.Itoa(addr.(*net.TCPAddr).Port)
	var stops []func()
	if s.svc.Tools != nil {
		stops = append(stops, s.svc.Tools.SubscribeTools(s.broadcastToolsChanged))
	}
	if s.svc.Runs != nil && s.svc.History != nil {
		// Each watcher is removed as its connection ends (closeConns),
		// which ends the watch's subscription to the runs.
		wctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { s.watch.loop(wctx) })
		stops = append(stops, func() {
			cancel()
			wg.Wait()
		})
	}
	var once sync.Once
	return s.handler(hosts), func() {
		once.Do(func() {
			s.closeConns()
			for i := len(stops) - 1; i >= 0; i-- {
				stops[i]()
			}
		})
	}, nil
}

type netConnKey struct{}

// ConnContext is the http.Server.ConnContext of a server that serves a
// Handler: it lets the Handler's stop close the connections of clients
// that do not finish the close handshake in time.
func ConnContext(ctx context.Context, nc net.Conn) context.Context {
	return context.WithValue(ctx, netConnKey{}, nc)
}

// closeConns refuses new connections, asks every open one to close and
// waits for their goroutines; connections that do not finish the close
// handshake within shutdownGrace are closed outright.
// toolsChangedFrame is the whole tools.changed notification.
var toolsChangedFrame = []byte(`{"jsonrpc":"2.0","method":"` + protocol.NotifyToolsChanged + `"}`)

// broadcastToolsChanged queues a tools.changed notification to every
// client without waiting; a client whose queue is full is dropped, as
// for run events.
func (s *Server) broadcastToolsChanged() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		if !c.q.tryPushLive(outMsg{data: toolsChangedFrame}) {
			c.end(websocket.StatusPolicyViolation, reasonTooSlow)
		}
	}
}

func (s *Server) closeConns() {
	s.mu.Lock()
	s.closing = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	for _, c := range conns {
		c.end(websocket.StatusGoingAway, "server shutting down")
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	t := time.NewTimer(shutdownGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	for _, c := range conns {
		if c.nc != nil {
			c.nc.Close()
		}
	}
	<-done
}

// allowedHosts returns the Host header values a request may carry: the
// loopback names with the listener's port, if the listener is bound to
// one address that address, and extra (Config.AllowedHosts).
func allowedHosts(addr net.Addr, extra []string) (map[string]bool, error) {
	a, ok := addr.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("ipc: listener address %q is not TCP", addr)
	}
	port := strconv.Itoa(a.Port)
	hosts := map[string]bool{
		"127.0.0.1:" + port: true,
		"localhost:" + port: true,
		"[::1]:" + port:     true,
	}
	if a.IP != nil && !a.IP.IsUnspecified() {
		hosts[strings.ToLower(net.JoinHostPort(a.IP.String(), port))] = true
	}
	for _, h := range extra {
		h = strings.ToLower(h)
		if _, _, err := net.SplitHostPort(h); err == nil {
			hosts[h] = true
			continue
		}
		hosts[h] = true
		hosts[net.JoinHostPort(strings.Trim(h, "[]"), port)] = true
	}
	if port == "80" { // browsers omit the default port
		for h := range hosts {
			hosts[strings.TrimSuffix(h, ":80")] = true
		}
	}
	return hosts, nil
}

// handler checks every request's Host, then routes it: the protocol's
// path and every non-public route through guard.
func (s *Server) handler(hosts map[string]bool) http.Handler {
	mux := s.mux
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// DNS rebinding: a page on evil.example resolving to 127.0.0.1
		// reaches us with its own name in Host.
		if !hosts[strings.ToLower(r.Host)] {
			s.log.Warn("ipc: rejected request", logkey.Remote, r.RemoteAddr, logkey.Reason, "host not allowed")
			http.Error(w, "forbidden: Host not allowed", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// guard lets through only requests that check lets through, and hands
// next the caller in the request's context.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, status := s.check(r)
		switch status {
		case http.StatusForbidden:
			s.log.Warn("ipc: rejected request", logkey.Remote, r.RemoteAddr, logkey.Reason, "origin not allowed")
			http.Error(w, "forbidden: Origin not allowed", http.StatusForbidden)
			return
		case http.StatusUnauthorized:
			s.log.Warn("ipc: rejected request", logkey.Remote, r.RemoteAddr, logkey.Reason, "bad or missing token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="keel"`)
			http.Error(w, "unauthorized: missing or wrong token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, who)))
	})
}

// caller is who a request authenticated as.
type caller struct {
	via    string   // viaToken, viaClientToken or viaSession
	name   string   // the client token's name, for viaClientToken
	scopes scopeSet // what it may do
	// origins are the client token's own origin patterns.
	origins originPatterns
	// session names the console session, for viaSession: a logout ends
	// the connections opened with it.
	session secretHash
}

// The credentials a caller authenticates with (protocol.Status.Via).
const (
	viaToken       = "token"        // the daemon's own token: every scope
	viaClientToken = "client_token" // a client token (token.create): its scopes
	viaSession     = "session"      // a console session cookie: every scope but admin
)

type callerKey struct{}

// check decides a request whose Host was checked: 403 if it has an
// Origin that is neither the daemon's own, nor an allowed one, nor one
// the client token it presents allows (or several Origin headers); else
// 200 and the caller if it carries the daemon's token or a live client
// token (a bearer header or a token subprotocol) or a live session
// cookie; else 401.
//
// A session cookie counts only on a request from the daemon's own
// origin: its Origin is the daemon's own, or it has no Origin and
// Sec-Fetch-Site is "same-origin" (a browser's same-origin GET, which
// carries no Origin). Browsers send cookies to every port of a host and
// on cross-origin WebSocket handshakes, so SameSite=Strict alone would
// let a page on another local port, or any page for a WebSocket, use
// the session: this check is what stops cross-site WebSocket hijacking
// and request forgery. Native programs have no cookie; they use a
// token.
func (s *Server) check(r *http.Request) (caller, int) {
	origins := r.Header.Values("Origin")
	if len(origins) > 1 {
		return caller{}, http.StatusForbidden
	}
	origin, hasOrigin := "", len(origins) == 1
	if hasOrigin {
		origin = origins[0]
	}
	own := hasOrigin && strings.ToLower(origin) == ownOrigin(r)
	originOK := !hasOrigin || own || s.origins.match(origin)
	who, found := s.tokenCaller(r)
	if found && !originOK && who.origins.match(origin) {
		originOK = true
	}
	if !originOK {
		return caller{}, http.StatusForbidden
	}
	if found {
		return who, http.StatusOK
	}
	sameOrigin := own || (!hasOrigin && r.Header.Get("Sec-Fetch-Site") == "same-origin")
	if sameOrigin {
		if h, ok := s.sessionCookie(r); ok {
			return caller{via: viaSession, scopes: sessionScopes, session: h}, http.StatusOK
		}
	}
	return caller{}, http.StatusUnauthorized
}

// ownOrigin is the origin of the daemon's own pages as r reached them
// (its Host, which the handler checked): "http://" + host, or
// "https://" over TLS, without a default port, as browsers write it.
func ownOrigin(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + strings.TrimSuffix(strings.ToLower(r.Host), ":443")
	}
	return "http://" + strings.TrimSuffix(strings.ToLower(r.Host), ":80")
}

// sessionCookie reports whether r carries a live session cookie, marks
// the session used, and returns its hash.
func (s *Server) sessionCookie(r *http.Request) (secretHash, bool) {
	for _, c := range r.CookiesNamed(s.cookie) {
		if h, ok := s.logins.use(c.Value); ok {
			return h, true
		}
	}
	return secretHash{}, false
}

// serveWebSocket upgrades a checked request and serves the connection
// until it ends.
func (s *Server) serveWebSocket() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != protocol.Path {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}

		nc, _ := r.Context().Value(netConnKey{}).(net.Conn)
		who, _ := r.Context().Value(callerKey{}).(caller)
		c := s.newConn(nc, r.RemoteAddr, r.Host, who)
		if !s.track(c) {
			c.cancel()
			http.Error(w, "server shutting down", http.StatusServiceUnavailable)
			return
		}
		defer s.untrack(c)

		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
			Subprotocols: []string{protocol.Subprotocol},
			// Origin was checked above, more strictly than Accept would.
			InsecureSkipVerify: true,
		})
		if err != nil {
			s.log.Debug("ipc: upgrade failed", logkey.Remote, r.RemoteAddr, logkey.Err, err)
			c.cancel()
			return
		}
		c.serve(ws)
	})
}

// maxPresented bounds the tokens of one request that are looked up.
const maxPresented = 4

// PresentedTokens returns the tokens r carries, as bearer headers or
// token subprotocols (protocol.TokenSubprotocolPrefix), at most 4: what
// a Server checks, for a front that picks which Server serves r.
func PresentedTokens(r *http.Request) []string {
	var toks []string
	for _, h := range r.Header.Values("Authorization") {
		scheme, tok, found := strings.Cut(strings.TrimSpace(h), " ")
		if found && strings.EqualFold(scheme, "Bearer") {
			toks = append(toks, strings.TrimSpace(tok))
		}
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if tok, found := strings.CutPrefix(strings.TrimSpace(p), protocol.TokenSubprotocolPrefix); found {
				toks = append(toks, tok)
			}
		}
	}
	if len(toks) > maxPresented {
		toks = toks[:maxPresented]
	}
	return toks
}

// tokenMatches reports whether tok is the daemon's own token, in
// constant time.
func (s *Server) tokenMatches(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.token[:]) == 1
}

// track registers c so that shutdown can close it; it fails once the
// server is shutting down.
func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// RouteCaller is who a request to a non-public route (Route) authenticated
// as.
type RouteCaller struct {
	// Via is how: "token" (the daemon's own), "client_token" (a token of
	// token.create) or "session" (a console session).
	Via string
	// Name is the client token's name (Via "client_token"), else empty.
	Name string
	// Scopes are the scopes it holds (keel.Scopes), in that order: the
	// daemon's token holds all, a session all but admin.
	Scopes []string
}

// CallerOf returns who r, a request a non-public route is serving,
// authenticated as; false for a request that did not pass the server's
// check (a public route's). A route that serves several operations
// checks each one's scope with it, as the server does per method.
func CallerOf(r *http.Request) (RouteCaller, bool) {
	who, ok := r.Context().Value(callerKey{}).(caller)
	if !ok {
		return RouteCaller{}, false
	}
	return RouteCaller{Via: who.via, Name: who.name, Scopes: who.scopes.names()}, true
}
