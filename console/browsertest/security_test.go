package browsertest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel/models/scripted"
)

// TestNotLoggedIn opens the console in a browser that never logged in:
// the page is served (it holds no data), the WebSocket is refused, and
// the page tells the user how to log in.
func TestNotLoggedIn(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil), nil, false)
	tab := newTab(t)
	run(t, tab, "open the console without logging in",
		chromedp.Navigate(k.base+"/#/runs"),
		visible(css(`#conn[data-state="login"]`)))
	msg := get(t, tab, "read the status line", textOf(css(`#conn`)))
	if !strings.Contains(msg, "keel open") {
		t.Errorf("status line = %q, want it to tell the user to run keel open", msg)
	}
}

// TestOtherOriginRefused serves a page from another loopback origin
// that opens a WebSocket to the daemon, in a browser logged in to the
// daemon (browsers send a host's cookies to all its ports, so the
// session cookie goes with the handshake): the daemon refuses it, while
// the console's own page, in the same browser, is connected.
func TestOtherOriginRefused(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil), nil, false)
	ws := "ws" + strings.TrimPrefix(k.base, "http") + "/v1/ws"
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>other</title><body><script>
const ws = new WebSocket(%q, ["keel.v1"]);
ws.onopen = () => { document.body.dataset.ws = "open"; };
ws.onclose = (e) => { if (!document.body.dataset.ws) document.body.dataset.ws = "refused " + e.code; };
</script></body>`, ws)
	}))
	t.Cleanup(other.Close)
	tab := newTab(t)
	login(t, tab, k)
	run(t, tab, "the console's own page connects",
		chromedp.Navigate(k.base+"/#/runs"),
		visible(css(`#conn[data-state="open"]`)))
	run(t, tab, "open the other origin's page", chromedp.Navigate(other.URL+"/"),
		waitJS(`document.body && document.body.dataset.ws !== undefined`))
	got := get(t, tab, "read its outcome", chromedp.Evaluate[string](`document.body.dataset.ws`))
	if !strings.HasPrefix(got, "refused") {
		t.Errorf("a page of %s opened a WebSocket to the daemon: %q, want it refused", other.URL, got)
	}
}

// TestLoginCodeSingleUse logs one browser in through a one-time URL,
// then opens the same URL in another browser (its own cookies): the
// code is used up, so the second is not logged in, and its console says
// how to log in.
func TestLoginCodeSingleUse(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil), nil, false)
	first := newTab(t)
	used := login(t, first, k)

	second := newTab(t)
	run(t, second, "open the used URL",
		chromedp.Navigate(used),
		chromedp.Navigate(k.base+"/#/runs"),
		visible(css(`#conn[data-state="login"]`)))
	// The first browser's session is unaffected.
	run(t, first, "the first browser stays logged in",
		chromedp.Reload(),
		visible(css(`#conn[data-state="open"]`)))
}
