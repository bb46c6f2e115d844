package browsertest_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel/models/scripted"
)

// TestPagesRender opens the tools, models, environment and live pages
// and checks that each shows what the daemon declares; a grant the tool
// does not request is refused, and the page says why.
func TestPagesRender(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil), nil, true)
	tab := newTab(t)
	login(t, tab, k)

	run(t, tab, "the tools page", chromedp.Navigate(k.base+"/#/tools"),
		visible(css(`article.tool[data-tool="tally"]`)))
	desc := get(t, tab, "read the tool", textOf(css(`article.tool[data-tool="tally"]`)))
	for _, want := range []string{"Count words.", "read_only", "None: calls that need a request fail"} {
		if !strings.Contains(desc, want) {
			t.Errorf("the tool's card lacks %q:\n%s", want, desc)
		}
	}
	run(t, tab, "grant what it does not request",
		chromedp.SetValue(css(`article.tool[data-tool="tally"] select`), "network"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('article.tool[data-tool="tally"] select').dispatchEvent(new Event('change'))`),
		chromedp.SendKeys(css(`article.tool[data-tool="tally"] input[id$="-value"]`), "https://example.com:443"),
		chromedp.Click(css(`article.tool[data-tool="tally"] button[type="submit"]`)),
		visible(css(`article.tool[data-tool="tally"] .alert[data-kind="error"]`)))
	refusal := get(t, tab, "read the refusal", textOf(css(`article.tool[data-tool="tally"] .alert`)))
	if !strings.Contains(refusal, "Grant failed") || !strings.Contains(refusal, "code -32602") {
		t.Errorf("refused grant reads %q, want the daemon's invalid-params error", refusal)
	}

	run(t, tab, "the models page", chromedp.Navigate(k.base+"/#/models"), visible(css(`main table`)))
	if models := get(t, tab, "read the models", textOf(css(`main`))); !strings.Contains(models, "scripted") {
		t.Errorf("the models page does not list the scripted model:\n%s", models)
	}
	run(t, tab, "the environment page", chromedp.Navigate(k.base+"/#/env"), visible(css(`main dl.facts`)))
	if env := get(t, tab, "read the environment", textOf(css(`main`))); !strings.Contains(env, "Default model") || !strings.Contains(env, "tally") {
		t.Errorf("the environment page lacks the default model or the tool:\n%s", env)
	}
	run(t, tab, "the live page", chromedp.Navigate(k.base+"/#/live"),
		waitJS(`document.querySelector('#live-count')?.textContent.startsWith('Following')`))
}
