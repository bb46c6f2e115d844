package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestHandler checks what each path answers and that every answer
// carries the security headers.
func TestHandler(t *testing.T) {
	t.Parallel()
	h := Handler()
	tests := []struct {
		path, wantType string
		want           int
	}{
		{"/", "text/html; charset=utf-8", http.StatusOK},
		{"/assets/style.css", "text/css; charset=utf-8", http.StatusOK},
		{"/assets/js/main.js", "text/javascript; charset=utf-8", http.StatusOK},
		{"/assets/index.html", "", http.StatusNotFound}, // served at / only
		{"/assets/", "", http.StatusNotFound},
		{"/assets/js/../../console.go", "", http.StatusNotFound},
		{"/nothing", "", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tt.path, nil)
			r.Host = "127.0.0.1:7433"
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("GET %s = %d, want %d", tt.path, w.Code, tt.want)
			}
			if tt.want != http.StatusOK {
				return
			}
			if got := w.Header().Get("Content-Type"); got != tt.wantType {
				t.Errorf("GET %s: Content-Type = %q, want %q", tt.path, got, tt.wantType)
			}
			for k, want := range map[string]string{
				"X-Content-Type-Options": "nosniff",
				"Referrer-Policy":        "no-referrer",
				"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
					"connect-src 'self' ws://127.0.0.1:7433; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
			} {
				if got := w.Header().Get(k); got != want {
					t.Errorf("GET %s: %s = %q, want %q", tt.path, k, got, want)
				}
			}
		})
	}
}

// TestIndexNamesProtocol checks that the page takes the WebSocket's path
// and subprotocol from package protocol, not from a copy.
func TestIndexNamesProtocol(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{
		`<meta name="keel-ws-path" content="` + protocol.Path + `">`,
		`<meta name="keel-subprotocol" content="` + protocol.Subprotocol + `">`,
		`<meta name="keel-status-path" content="` + protocol.StatusPath + `">`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the page lacks %s", want)
		}
	}
}

// TestCSPHostChecked checks that a Host that is not a host name is kept
// out of the policy instead of extending it.
func TestCSPHostChecked(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]string{
		"localhost:80":            "connect-src 'self' ws://localhost:80;",
		"[::1]:7433":              "connect-src 'self' ws://[::1]:7433;",
		"a.example; script-src *": "connect-src 'self';",
		"":                        "connect-src 'self';",
	} {
		if got := csp(host); !strings.Contains(got, want) {
			t.Errorf("csp(%q) = %q, want it to hold %q", host, got, want)
		}
	}
}

// TestRevalidate checks the ETag round trip: an unchanged asset is 304.
func TestRevalidate(t *testing.T) {
	t.Parallel()
	h := Handler()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/assets/style.css", nil))
	etag := w.Header().Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	r := httptest.NewRequest(http.MethodGet, "/assets/style.css", nil)
	r.Header.Set("If-None-Match", etag)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotModified {
		t.Errorf("GET with If-None-Match: %d, want 304", w.Code)
	}
}

// TestScriptsBuildDOMAsText keeps the pages from parsing anything as
// markup: what the daemon sends (goals, tool output, model text) is put
// in the DOM as text. A script that uses an HTML sink fails this test.
func TestScriptsBuildDOMAsText(t *testing.T) {
	t.Parallel()
	sink := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(|createContextualFragment|setHTMLUnsafe|srcdoc`)
	n := 0
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, ".js") {
			return err
		}
		n++
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := sink.FindString(line); m != "" && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				t.Errorf("%s:%d uses %s", p, i+1, m)
			}
		}
		return nil
	})
	if err != nil || n < 5 {
		t.Fatalf("walked %d scripts: %v", n, err)
	}
}
