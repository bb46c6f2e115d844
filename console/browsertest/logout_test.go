package browsertest_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestLogoutInBrowser logs a browser out with the button in the page's
// header: the page says to log in again, and the old session cookie, put back in the browser or sent over plain HTTP,
// opens nothing; another browser's session goes on.
func TestLogoutInBrowser(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil), nil, false)
	tab, other := newTab(t), newTab(t)
	login(t, tab, k)
	login(t, other, k)
	old := sessionCookie(t, tab, k)

	if !get(t, tab, "find the button", chromedp.Evaluate[bool](`!!document.querySelector('header #logout button')`)) {
		t.Fatal("the page has no Log out button in its header")
	}
	run(t, tab, "log out", chromedp.Click(css(`header #logout button`)),
		visible(css(`#conn[data-state="login"]`)))

	req, err := http.NewRequest(http.MethodGet, k.base+protocol.StatusPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", k.base)
	req.AddCookie(&http.Cookie{Name: old.Name, Value: old.Value})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET %s with the logged-out cookie = %d, want 401", protocol.StatusPath, resp.StatusCode)
	}

	yes := true
	run(t, tab, "put the old cookie back and reload",
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, network.SetCookie, network.SetCookieParams{Name: old.Name, Value: old.Value, URL: k.base + "/",
				HTTPOnly: &yes, SameSite: network.CookieSameSiteStrict})
			return err
		}),
		chromedp.Reload(),
		visible(css(`#conn[data-state="login"]`)))
	if c := sessionCookie(t, tab, k); c.Value != old.Value {
		t.Fatalf("the old cookie was not put back")
	}
	run(t, other, "another browser stays logged in", chromedp.Reload(), visible(css(`#conn[data-state="open"]`)))
}
