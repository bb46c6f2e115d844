package ipc_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// memTokens is an in-memory ipc.ClientTokens (the store's is tested in
// store and end to end in cli).
type memTokens struct {
	mu sync.Mutex
	m  map[string]keel.ClientToken
}

func (m *memTokens) CreateClientToken(_ context.Context, t keel.ClientToken) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[t.Name]; ok {
		return keel.ErrConflict
	}
	m.m[t.Name] = t
	return nil
}

func (m *memTokens) ClientTokenBySHA256(_ context.Context, sum string) (keel.ClientToken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.m {
		if t.SHA256 == sum {
			return t, nil
		}
	}
	return keel.ClientToken{}, keel.ErrNotFound
}

func (m *memTokens) ClientTokens(context.Context) ([]keel.ClientToken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []keel.ClientToken
	for _, t := range m.m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b keel.ClientToken) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (m *memTokens) DeleteClientToken(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[name]; !ok {
		return keel.ErrNotFound
	}
	delete(m.m, name)
	return nil
}

func (m *memTokens) TouchClientToken(_ context.Context, name string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.m[name]; ok {
		t.LastUsed = at
		m.m[name] = t
	}
	return nil
}

// tokenServer is a console server whose Services keep client tokens.
type tokenServer struct {
	*consoleServer
	admin *tclient // the daemon's own token
}

// unserved stands in for the groups ipctest's fake does not serve, so
// that every method is served and reaches the scope check; calling one
// panics, which the server reports as an internal error.
type unserved struct {
	ipc.RunControl
	ipc.RunSteering
	ipc.Policy
	ipc.RunLabels
}

type unservedChat struct{}

func (unservedChat) Chat(context.Context, keel.ChatRequest, func(keel.ChatDelta)) (keel.ChatReply, error) {
	return keel.ChatReply{}, keel.ErrUnavailable
}

func startTokenServer(t *testing.T, cfg ipc.Config) *tokenServer {
	t.Helper()
	svc := ipctest.Services(ipctest.New())
	svc.Tokens = &memTokens{m: map[string]keel.ClientToken{}}
	if svc.Control == nil {
		svc.Control = unserved{}
	}
	if svc.Steering == nil {
		svc.Steering = unserved{}
	}
	if svc.Chat == nil {
		svc.Chat = unservedChat{}
	}
	if svc.Policy == nil {
		svc.Policy = unserved{}
	}
	if svc.Labels == nil {
		svc.Labels = unserved{}
	}
	cs := &consoleServer{clock: newFakeClock(), log: &syncBuffer{}}
	cfg.Now = cs.clock.Now
	cs.testServer = startServer(t, svc, cfg)
	cs.base = "http://127.0.0.1:" + itoa(cs.port)
	return &tokenServer{consoleServer: cs, admin: dial(t, cs.testServer)}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// create makes a client token with the daemon's own token.
func (ts *tokenServer) create(t *testing.T, p protocol.TokenCreateParams) string {
	t.Helper()
	ts.admin.t = t
	var res protocol.TokenCreateResult
	ts.admin.callOK(protocol.MethodTokenCreate, p, &res)
	return res.Token
}

// dialToken dials with tok as a browser would (token subprotocol).
func (ts *tokenServer) dialToken(t *testing.T, tok, origin string) (*tclient, int, error) {
	t.Helper()
	ws, status, err := dialRaw(t, ts.url, dialOpts{subprotocols: []string{protocol.Subprotocol, protocol.TokenSubprotocolPrefix + tok}, origin: origin})
	if err != nil {
		return nil, status, err
	}
	return &tclient{t: t, ws: ws}, status, nil
}

// wantScope is the scope each method needs: the specification the
// server's table is checked against.
var wantScope = map[string]string{
	protocol.MethodInitialize: "",
	protocol.MethodRunList:    "read", protocol.MethodRunGet: "read", protocol.MethodRunSubscribe: "read", protocol.MethodRunUnsubscribe: "read",
	protocol.MethodToolsList: "read", protocol.MethodToolsAudit: "read", protocol.MethodEnvDescribe: "read", protocol.MethodModelsList: "read",
	protocol.MethodPolicyShow: "read", protocol.MethodPolicyExplain: "read",
	protocol.MethodRunStart: "run", protocol.MethodRunSay: "run", protocol.MethodRunPause: "run", protocol.MethodRunResume: "run",
	protocol.MethodRunCancel: "run", protocol.MethodRunFork: "run", protocol.MethodRunReplay: "run", protocol.MethodRunTakeOver: "run",
	protocol.MethodRunHandBack: "run", protocol.MethodRunTool: "run", protocol.MethodToolsCall: "run", protocol.MethodModelsChat: "run",
	protocol.MethodRunApprove: "approve", protocol.MethodRunDecide: "approve", protocol.MethodRunDeclassify: "approve",
	protocol.MethodToolsInspect: "tools", protocol.MethodToolsInstall: "tools", protocol.MethodToolsRemove: "tools",
	protocol.MethodToolsGrant: "tools", protocol.MethodToolsRevoke: "tools",
	protocol.MethodModelsPull: "admin", protocol.MethodConsoleLogin: "admin",
	protocol.MethodTokenCreate: "admin", protocol.MethodTokenList: "admin", protocol.MethodTokenRevoke: "admin",
}

// TestClientTokenScopes calls every method with a token of each scope
// over a real WebSocket: a method outside the token's scopes fails with
// -32004 naming the scope it needs, one inside gets past the check.
func TestClientTokenScopes(t *testing.T) {
	t.Parallel()
	ts := startTokenServer(t, ipc.Config{})
	for _, scope := range keel.Scopes {
		t.Run(scope, func(t *testing.T) {
			tok := ts.create(t, protocol.TokenCreateParams{Name: "only-" + scope, Scopes: []string{scope}})
			c, status, err := ts.dialToken(t, tok, "")
			if err != nil {
				t.Fatalf("dial with a %s token: %d %v", scope, status, err)
			}
			var init protocol.InitializeResult
			c.callOK(protocol.MethodInitialize, nil, &init)
			if !slices.Equal(init.Scopes, []string{scope}) {
				t.Errorf("initialize scopes = %v, want [%s]", init.Scopes, scope)
			}
			for method, need := range wantScope {
				if method == protocol.MethodTokenRevoke {
					continue // would revoke itself; TestClientTokenRevoke
				}
				m := c.call(method, nil)
				if m.Error != nil && m.Error.Code == protocol.CodeMethodNotFound {
					t.Fatalf("%s is not served", method)
				}
				forbidden := m.Error != nil && m.Error.Code == protocol.CodeForbidden
				if want := need != "" && need != scope; forbidden != want {
					t.Errorf("%s with a %s token: error %+v, want forbidden = %v", method, scope, m.Error, want)
					continue
				}
				if forbidden {
					var data protocol.ForbiddenData
					if err := json.Unmarshal(m.Error.Data, &data); err != nil || data.Scope != need || data.Method != method || !strings.Contains(m.Error.Message, need) {
						t.Errorf("%s with a %s token: error %q data %s, want it to name scope %s", method, scope, m.Error.Message, m.Error.Data, need)
					}
				}
			}
		})
	}
}

// TestSessionScopes: a console session may do everything but admin.
func TestSessionScopes(t *testing.T) {
	t.Parallel()
	ts := startTokenServer(t, ipc.Config{})
	var res protocol.ConsoleLoginResult
	ts.admin.callOK(protocol.MethodConsoleLogin, nil, &res)
	resp := get(t, http.MethodGet, res.URL, nil)
	if len(resp.Cookies()) != 1 {
		t.Fatalf("login: %d %v", resp.StatusCode, resp.Cookies())
	}
	ws, status, err := dialRaw(t, ts.url, dialOpts{origin: ts.base, header: cookieHeader(resp.Cookies()[0])})
	if err != nil {
		t.Fatalf("dial with the session: %d %v", status, err)
	}
	c := &tclient{t: t, ws: ws}
	for _, m := range []string{protocol.MethodConsoleLogin, protocol.MethodTokenCreate, protocol.MethodTokenList, protocol.MethodModelsPull} {
		if e := c.call(m, nil).Error; e == nil || e.Code != protocol.CodeForbidden {
			t.Errorf("%s over a session: %+v, want forbidden", m, e)
		}
	}
	var run keel.Run
	c.callOK(protocol.MethodRunStart, protocol.RunStartParams{Goal: "g"}, &run)
}

func TestTokenCreateChecks(t *testing.T) {
	t.Parallel()
	ts := startTokenServer(t, ipc.Config{})
	past := ts.clock.Now().Add(-time.Second)
	for _, tt := range []struct {
		name     string
		p        protocol.TokenCreateParams
		wantCode int
		wantMsg  string
	}{
		{"bad name", protocol.TokenCreateParams{Name: "VS Code", Scopes: []string{"read"}}, protocol.CodeInvalidParams, "name"},
		{"no name", protocol.TokenCreateParams{Scopes: []string{"read"}}, protocol.CodeInvalidParams, "name"},
		{"no scopes", protocol.TokenCreateParams{Name: "a"}, protocol.CodeInvalidParams, "scopes"},
		{"unknown scope", protocol.TokenCreateParams{Name: "a", Scopes: []string{"root"}}, protocol.CodeInvalidParams, "root"},
		{"every http origin", protocol.TokenCreateParams{Name: "a", Scopes: []string{"read"}, Origins: []string{"http://*"}}, protocol.CodeInvalidParams, "every http page"},
		{"null origin", protocol.TokenCreateParams{Name: "a", Scopes: []string{"read"}, Origins: []string{"null"}}, protocol.CodeInvalidParams, "sandboxed"},
		{"expired", protocol.TokenCreateParams{Name: "a", Scopes: []string{"read"}, ExpiresAt: past}, protocol.CodeInvalidParams, "expires_at"},
	} {
		m := ts.admin.call(protocol.MethodTokenCreate, tt.p)
		if m.Error == nil || m.Error.Code != tt.wantCode || !strings.Contains(m.Error.Message, tt.wantMsg) {
			t.Errorf("%s: token.create = %+v, want code %d mentioning %q", tt.name, m.Error, tt.wantCode, tt.wantMsg)
		}
	}
	tok := ts.create(t, protocol.TokenCreateParams{Name: "vscode", Scopes: []string{"run", "read", "read"}})
	if !strings.HasPrefix(tok, "keel_ct_") || len(tok) < 40 {
		t.Errorf("token = %q, want keel_ct_ and 256 random bits", tok)
	}
	if m := ts.admin.call(protocol.MethodTokenCreate, protocol.TokenCreateParams{Name: "vscode", Scopes: []string{"read"}}); m.Error == nil || m.Error.Code != protocol.CodeConflict {
		t.Errorf("token.create of an existing name = %+v, want conflict", m.Error)
	}

	// A token never gets more than its maker has.
	sub := ts.create(t, protocol.TokenCreateParams{Name: "sub-admin", Scopes: []string{"admin", "read"}})
	c, _, err := ts.dialToken(t, sub, "")
	if err != nil {
		t.Fatal(err)
	}
	m := c.call(protocol.MethodTokenCreate, protocol.TokenCreateParams{Name: "wider", Scopes: []string{"read", "tools"}})
	if m.Error == nil || m.Error.Code != protocol.CodeForbidden || !strings.Contains(m.Error.Message, "tools") {
		t.Errorf("an admin,read token creating a tools token: %+v, want forbidden naming tools", m.Error)
	}
	c.callOK(protocol.MethodTokenCreate, protocol.TokenCreateParams{Name: "narrower", Scopes: []string{"read"}}, nil)

	var list protocol.TokenListResult
	ts.admin.callOK(protocol.MethodTokenList, nil, &list)
	raw, _ := json.Marshal(list)
	if strings.Contains(string(raw), tok) || strings.Contains(string(raw), strings.TrimPrefix(tok, "keel_ct_")) || strings.Contains(string(raw), "sha256") {
		t.Errorf("token.list shows a secret or its hash: %s", raw)
	}
	var names []string
	for _, ti := range list.Tokens {
		names = append(names, ti.Name)
		if ti.Name == "vscode" && !slices.Equal(ti.Scopes, []string{"read", "run"}) {
			t.Errorf("vscode scopes = %v, want [read run]", ti.Scopes)
		}
	}
	if !slices.Equal(names, []string{"narrower", "sub-admin", "vscode"}) {
		t.Errorf("token.list names = %v", names)
	}
}

// TestClientTokenOrigins: a token's own origin patterns let pages of
// those origins use it (and only it); the daemon's allowed origins take
// patterns too.
func TestClientTokenOrigins(t *testing.T) {
	t.Parallel()
	ts := startTokenServer(t, ipc.Config{AllowedOrigins: []string{"http://localhost:*"}})
	tok := ts.create(t, protocol.TokenCreateParams{Name: "vscode", Scopes: []string{"read"}, Origins: []string{"vscode-webview://*"}})
	plain := ts.create(t, protocol.TokenCreateParams{Name: "plain", Scopes: []string{"read"}})
	for _, tt := range []struct {
		name, tok, origin string
		want              int
	}{
		{"token's origin", tok, "vscode-webview://0a1b2c3d4e5f", 0},
		{"token's origin, another webview", tok, "vscode-webview://ffee", 0},
		{"no origin", tok, "", 0},
		{"global pattern", tok, "http://localhost:3000", 0},
		{"foreign origin", tok, "http://evil.example", http.StatusForbidden},
		{"token's pattern, other scheme", tok, "http://0a1b2c3d4e5f", http.StatusForbidden},
		{"another token from the webview", plain, "vscode-webview://0a1b2c3d4e5f", http.StatusForbidden},
		{"the daemon's token from the webview", testToken, "vscode-webview://0a1b2c3d4e5f", http.StatusForbidden},
		{"the daemon's token, global pattern", testToken, "http://localhost:5173", 0},
		{"the daemon's token, global pattern's other host", testToken, "http://127.0.0.1:5173", http.StatusForbidden},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, status, err := ts.dialToken(t, tt.tok, tt.origin)
			if tt.want == 0 {
				if err != nil {
					t.Fatalf("dial from %q: %d %v, want an upgrade", tt.origin, status, err)
				}
				c.callOK(protocol.MethodInitialize, nil, nil)
				return
			}
			if err == nil || status != tt.want {
				t.Errorf("dial from %q: %d %v, want %d", tt.origin, status, err, tt.want)
			}
		})
	}
	if err := ipc.CheckOrigins([]string{"http://localhost:5173", "http://*"}); !errors.Is(err, ipc.ErrOriginPattern) {
		t.Errorf("CheckOrigins(http://*) = %v, want ErrOriginPattern", err)
	}
	if _, err := ipc.NewServer(ipctest.Services(ipctest.New()), ipc.Config{Token: "t", AllowedOrigins: []string{"*"}}); !errors.Is(err, ipc.ErrOriginPattern) {
		t.Errorf("NewServer with origin * = %v, want ErrOriginPattern", err)
	}
}

// TestClientTokenLifetime: a token records its last use, stops working
// when it expires, and revoking it closes its connections at once.
func TestClientTokenLifetime(t *testing.T) {
	t.Parallel()
	ts := startTokenServer(t, ipc.Config{})
	exp := ts.clock.Now().Add(time.Hour)
	brief := ts.create(t, protocol.TokenCreateParams{Name: "brief", Scopes: []string{"read"}, ExpiresAt: exp})
	if _, _, err := ts.dialToken(t, brief, ""); err != nil {
		t.Fatalf("dial before expiry: %v", err)
	}
	var list protocol.TokenListResult
	ts.admin.callOK(protocol.MethodTokenList, nil, &list)
	if len(list.Tokens) != 1 || !list.Tokens[0].LastUsed.Equal(ts.clock.Now()) || !list.Tokens[0].Expires.Equal(exp) {
		t.Errorf("token.list = %+v, want last used now, expiring at %v", list.Tokens, exp)
	}
	ts.clock.advance(time.Hour)
	if _, status, err := ts.dialToken(t, brief, ""); err == nil || status != http.StatusUnauthorized {
		t.Errorf("dial with an expired token: %d %v, want 401", status, err)
	}

	tok := ts.create(t, protocol.TokenCreateParams{Name: "vscode", Scopes: []string{"read"}})
	c, _, err := ts.dialToken(t, tok, "")
	if err != nil {
		t.Fatal(err)
	}
	c.callOK(protocol.MethodInitialize, nil, nil)
	var res protocol.TokenRevokeResult
	ts.admin.callOK(protocol.MethodTokenRevoke, protocol.TokenRevokeParams{Name: "vscode"}, &res)
	if res.Closed != 1 {
		t.Errorf("token.revoke closed %d connections, want 1", res.Closed)
	}
	_, err = c.tryRead(10 * time.Second)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || ce.Reason != "token revoked" {
		t.Errorf("the revoked token's connection: %v, want close 1008 \"token revoked\"", err)
	}
	if _, status, err := ts.dialToken(t, tok, ""); err == nil || status != http.StatusUnauthorized {
		t.Errorf("dial with a revoked token: %d %v, want 401", status, err)
	}
	if m := ts.admin.call(protocol.MethodTokenRevoke, protocol.TokenRevokeParams{Name: "vscode"}); m.Error == nil || m.Error.Code != protocol.CodeNotFound {
		t.Errorf("token.revoke twice: %+v, want not found", m.Error)
	}
	// The status endpoint names the client and its scopes.
	other := ts.create(t, protocol.TokenCreateParams{Name: "ci", Scopes: []string{"read", "run"}})
	resp, body := getBody(t, http.MethodGet, ts.base+protocol.StatusPath, http.Header{"Authorization": {"Bearer " + other}})
	var st protocol.Status
	json.Unmarshal([]byte(body), &st)
	if resp.StatusCode != http.StatusOK || st.Via != "client_token" || st.Client != "ci" || !slices.Equal(st.Scopes, []string{"read", "run"}) {
		t.Errorf("status with a client token = %d %s", resp.StatusCode, body)
	}
}
