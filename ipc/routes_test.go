package ipc_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
)

// TestRoutes checks Config.Routes over real loopback HTTP: a public route
// needs no credentials but still an allowed Host; a guarded route answers
// 401 without the token and 403 to a foreign Origin or Host, exactly as
// the WebSocket path does; unknown paths stay 404.
func TestRoutes(t *testing.T) {
	t.Parallel()
	text := func(s string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, s) })
	}
	ts := startServer(t, ipctest.New(), ipc.Config{Routes: []ipc.Route{
		{Pattern: "GET /page/", Handler: text("page"), Public: true},
		{Pattern: "GET /data", Handler: text("data")},
	}})
	port := strconv.Itoa(ts.port)
	base := "http://127.0.0.1:" + port
	bearer := map[string]string{"Authorization": "Bearer " + testToken}
	tests := []struct {
		name     string
		path     string
		header   map[string]string
		host     string
		want     int
		wantBody string
	}{
		{"public without token", "/page/x.js", nil, "", http.StatusOK, "page"},
		{"public, foreign host", "/page/x.js", nil, "evil.example:" + port, http.StatusForbidden, ""},
		{"guarded without token", "/data", nil, "", http.StatusUnauthorized, ""},
		{"guarded, wrong token", "/data", map[string]string{"Authorization": "Bearer nope"}, "", http.StatusUnauthorized, ""},
		{"guarded with token", "/data", bearer, "", http.StatusOK, "data"},
		{"guarded, foreign origin", "/data", map[string]string{"Authorization": "Bearer " + testToken, "Origin": "http://evil.example"}, "", http.StatusForbidden, ""},
		{"guarded, foreign host", "/data", bearer, "evil.example:" + port, http.StatusForbidden, ""},
		{"unknown path", "/nothing", bearer, "", http.StatusNotFound, ""},
		{"guarded, wrong method", "/data", nil, "", http.StatusMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodGet
			if tt.want == http.StatusMethodNotAllowed {
				method = http.MethodPost
			}
			req, err := http.NewRequest(method, base+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want || (tt.wantBody != "" && string(body) != tt.wantBody) {
				t.Errorf("%s %s = %d %q, want %d %q", method, tt.path, resp.StatusCode, body, tt.want, tt.wantBody)
			}
		})
	}
}

func TestNewServerRejectsBadRoute(t *testing.T) {
	t.Parallel()
	h := http.NotFoundHandler()
	for name, routes := range map[string][]ipc.Route{
		"no handler":               {{Pattern: "GET /x"}},
		"the protocol's own path":  {{Pattern: "/v1/ws", Handler: h}},
		"two routes, same pattern": {{Pattern: "GET /x", Handler: h}, {Pattern: "GET /x", Handler: h}},
		"malformed pattern":        {{Pattern: "GET x", Handler: h}},
	} {
		if _, err := ipc.NewServer(ipctest.Services(ipctest.New()), ipc.Config{Token: "t", Routes: routes}); err == nil {
			t.Errorf("%s: NewServer = nil error, want an error", name)
		}
	}
}
