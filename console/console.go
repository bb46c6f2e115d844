package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/keel-runtime/keel/ipc/protocol"
)

//go:embed assets
var assets embed.FS

// Patterns are the http.ServeMux patterns Handler serves: the page at /
// and its assets under /assets/. Neither overlaps protocol.Path, so a
// daemon can register both beside the WebSocket.
var Patterns = []string{"GET /{$}", "GET /assets/"}

// file is one asset ready to serve.
type file struct {
	body  []byte
	ctype string
	etag  string
}

// contentTypes are the types of the assets, by extension; an asset of
// another extension is not served (nosniff needs the right type).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Handler returns the console's handler: GET / is the page, GET
// /assets/NAME its files; any other path is 404. The page learns the
// WebSocket's path and subprotocol (protocol.Path, protocol.Subprotocol)
// and the status endpoint (protocol.StatusPath) from its own markup, and
// its Log out button posts to protocol.LogoutPath. It is safe for
// concurrent use, and it panics only
// if the embedded assets are broken, which the package's tests rule out.
func Handler() http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		if p == "assets/index.html" {
			if b, err = renderIndex(b); err != nil {
				return err
			}
			p = "/"
		} else {
			p = "/" + p
		}
		sum := sha256.Sum256(b)
		files[p] = file{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil || files["/"].body == nil {
		panic("console: embedded assets: " + errString(err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", csp(r.Host))
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Content-Type", f.ctype)
		// Revalidated every time: a new keel serves new pages at once.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
	})
}

func errString(err error) string {
	if err == nil {
		return "no index.html"
	}
	return err.Error()
}

// renderIndex fills the protocol's constants into the page's markup.
func renderIndex(b []byte) ([]byte, error) {
	t, err := template.New("index").Parse(string(b))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = t.Execute(&out, struct{ Path, Subprotocol, StatusPath, LogoutPath string }{protocol.Path, protocol.Subprotocol, protocol.StatusPath, protocol.LogoutPath})
	return out.Bytes(), err
}

// csp is the page's Content-Security-Policy: scripts, styles, images and
// connections only from the daemon's own origin. 'self' does not cover
// ws: in every browser, so the WebSocket's origin is named too, from the
// request's Host (which the server checked against its own addresses);
// a Host with characters a host cannot have is left out.
func csp(host string) string {
	connect := "'self'"
	if validHost(host) {
		connect += " ws://" + host
	}
	return strings.Join([]string{
		"default-src 'self'",
		"script-src 'self'",
		"style-src 'self'",
		"img-src 'self'",
		"connect-src " + connect,
		"object-src 'none'",
		"base-uri 'none'",
		"form-action 'self'",
		"frame-ancestors 'none'",
	}, "; ")
}

func validHost(h string) bool {
	if h == "" {
		return false
	}
	for _, c := range h {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune(".:-[]", c):
		default:
			return false
		}
	}
	return true
}
