package browsertest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// instrumentJS runs first in every document of every tab (newTab): it
// records each request the page sends over a WebSocket (method and
// params) in window.keelTest.sent, and keeps the page's pending timers
// (intervals, and timeouts not yet run) that its own scripts set, for
// window.keelTest.timers().
const instrumentJS = `(() => {
  if (window.keelTest) return;
  const sent = [], pending = new Set();
  const si = window.setInterval, ci = window.clearInterval, st = window.setTimeout, ct = window.clearTimeout;
  // Only the console's own timers count, not those of the test driver's
  // injected scripts: the console's are set from its modules.
  const own = () => (new Error().stack || '').includes('/assets/js/');
  window.setInterval = function (fn, ...rest) { const id = si.call(window, fn, ...rest); if (own()) pending.add(id); return id; };
  window.clearInterval = function (id) { pending.delete(id); return ci.call(window, id); };
  window.setTimeout = function (fn, ...rest) {
    const id = st.call(window, function (...a) { pending.delete(id); return typeof fn === 'function' ? fn.apply(this, a) : undefined; }, ...rest);
    if (own()) pending.add(id);
    return id;
  };
  window.clearTimeout = function (id) { pending.delete(id); return ct.call(window, id); };
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    try { const m = JSON.parse(data); sent.push({ method: m.method, params: m.params }); } catch (e) {}
    return send.call(this, data);
  };
  window.keelTest = { sent, timers: () => pending.size };
})();`

// sent counts the requests of the given methods the tab's page has sent
// over its WebSocket since it loaded (every tab is instrumented: see
// newTab).
func sent(t *testing.T, tab context.Context, methods ...string) int {
	t.Helper()
	list := `['` + strings.Join(methods, `','`) + `']`
	return get(t, tab, "count the requests sent", chromedp.Evaluate[int](fmt.Sprintf(`window.keelTest.sent.filter((m) => %s.includes(m.method)).length`, list)))
}

// sessionCookie returns the tab's session cookie for k.
func sessionCookie(t *testing.T, tab context.Context, k *instance) *network.Cookie {
	t.Helper()
	res := get(t, tab, "read the cookies", func(ctx context.Context, tg *chromedp.Target) (network.GetCookiesResult, error) {
		return cdp.Call(ctx, tg, network.GetCookies, network.GetCookiesParams{URLs: []string{k.base + "/"}})
	})
	for _, c := range res.Cookies {
		if strings.HasPrefix(c.Name, "keel_session_") {
			return c
		}
	}
	t.Fatalf("the tab has no session cookie for %s: %+v", k.base, res.Cookies)
	return nil
}
