package browsertest_test

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// openURL runs `keel open --print` against k, as a user would, and
// returns the one-time login URL it prints.
func openURL(t *testing.T, k *instance) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Main(context.Background(), []string{"open", "--print", "--data-dir", k.dir}, &out, &errb); code != 0 {
		t.Fatalf("keel open --print = %d: %s%s", code, out.String(), errb.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if u, err := url.Parse(strings.TrimSpace(line)); err == nil && u.Path == protocol.LoginPath && u.Query().Get("code") != "" {
			return u.String()
		}
	}
	t.Fatalf("keel open --print printed no login URL:\n%s", out.String())
	return ""
}

// login logs the tab in to k through a one-time URL from keel open:
// the daemon exchanges the code for a session cookie and redirects to
// the console, which connects. It returns the URL, used up.
func login(t *testing.T, tab context.Context, k *instance) string {
	t.Helper()
	u := openURL(t, k)
	run(t, tab, "log in through the one-time URL",
		chromedp.Navigate(u),
		visible(css(`#conn[data-state="open"]`)))
	if loc := get(t, tab, "read the location", chromedp.Location()); strings.Contains(loc, "code=") {
		t.Errorf("after login the address is %s: the code stays in the address bar", loc)
	}
	return u
}
