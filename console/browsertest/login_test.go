package browsertest_test

import (
	"context"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// allowSelf is the AllowedOrigins a daemon needs for its own pages.
func allowSelf(base string) []string { return []string{base} }

// login makes the tab's requests to k carry its credentials.
func login(t *testing.T, tab context.Context, k *instance) {
	t.Helper()
	tok, err := tokenOf(k)
	if err != nil {
		t.Fatal(err)
	}
	run(t, tab, "log in", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer " + tok}})
		return err
	}), chromedp.Navigate(k.base+"/"))
}
