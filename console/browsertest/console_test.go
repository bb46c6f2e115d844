package browsertest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestRunApprovedInBrowser is a user's path through the console: log in,
// start a run from the runs page, watch its events arrive on its page
// (its model calls a tool that needs approval), approve the call with
// edited arguments in the inbox, and see the run finish with the edited
// input and its waterfall complete.
func TestRunApprovedInBrowser(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: tally, Arguments: json.RawMessage(`{"text":"one two three"}`)}),
		scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: "counted: " + req.Messages[len(req.Messages)-1].Content}}, nil
		})),
	)
	k := startKeel(t, p, []keel.SideEffect{keel.SideEffectReadOnly}, true)
	tab := newTab(t)
	login(t, tab, k)

	const goal = `count <b>words</b> & "quote"`
	run(t, tab, "start a run from the runs page",
		visible(css(`#conn[data-state="open"]`)),
		chromedp.Click(css(`details.new-run summary`)),
		chromedp.SendKeys(css(`#new-goal`), goal),
		chromedp.Click(css(`details.new-run button[type="submit"]`)),
		// The page goes to the run's, whose events stream in.
		visible(css(`#events li[data-type="run.started"]`)),
		visible(css(`#events li[data-type="approval.requested"]`)),
		visible(css(`article.wait[data-call="c1"]`)),
	)
	runURL := get(t, tab, "read the run's URL", chromedp.Location())
	shownGoal := get(t, tab, "read the goal", textOf(css(`.facts .goal`)))
	if shownGoal != goal {
		t.Errorf("the run page shows the goal as %q, want %q as text", shownGoal, goal)
	}
	id := keel.RunID(runURL[strings.LastIndex(runURL, "/")+1:])
	bold := get(t, tab, "count markup from data", chromedp.Evaluate[int](`document.querySelectorAll('main b').length - document.querySelectorAll('main b.type, main .span-name b, main .dag-list b').length`))
	if bold != 0 {
		t.Errorf("the goal's <b> became an element (%d): data was parsed as markup", bold)
	}

	run(t, tab, "approve with edited arguments in the inbox",
		chromedp.Navigate(k.base+"/#/approvals"),
		visible(css(`#inbox article.wait[data-call="c1"] textarea`)),
	)
	if png := shot(t, tab); png != nil {
		screenshot(t, "console-approvals.png", png)
	}
	// With the keyboard: from the arguments, Tab reaches Approve, Enter
	// presses it.
	run(t, tab, "approve",
		chromedp.SetValue(css(`#inbox article.wait[data-call="c1"] textarea`), `{"text":"just two"}`),
		chromedp.Focus(css(`#inbox article.wait[data-call="c1"] textarea`)),
		chromedp.KeyEvent("\t"),
		waitJS(`document.activeElement?.classList.contains('approve')`),
		chromedp.KeyEvent("\r"),
		waitJS(`document.querySelector('#inbox article.wait[data-call="c1"] .alert')?.dataset.kind === 'ok' || !document.querySelector('#inbox article.wait[data-call="c1"]')`),
	)

	run(t, tab, "see the finished run and its waterfall",
		chromedp.Navigate(runURL),
		visible(css(`#events li[data-type="run.succeeded"]`)),
		visible(css(`#waterfall[data-status="succeeded"] tr[data-kind="tool.call"]`)),
		visible(css(`#waterfall tr[data-kind="human.wait"]`)),
		visible(css(`#waterfall tr[data-kind="model.call"]`)),
	)
	result := get(t, tab, "read the result", textOf(css(`.facts .result`)))
	approval := get(t, tab, "read the approval", textOf(css(`#events li[data-type="approval.decision"] .sum`)))
	if !strings.Contains(result, `"words":2`) {
		t.Errorf("the run's result on its page = %q, want the tool's output (\"words\":2)", result)
	}
	if call := get(t, tab, "read the tool call", textOf(css(`#events li[data-type="tool.call"] .sum`))); !strings.Contains(call, `{"text":"just two"}`) {
		t.Errorf("the tool.call event reads %q, want the edited arguments", call)
	}
	if !strings.Contains(approval, "approved") || !strings.Contains(approval, "edited") {
		t.Errorf("the approval.decision event reads %q, want an approval with edited arguments", approval)
	}
	if png := shot(t, tab); png != nil {
		screenshot(t, "console-run.png", png)
	}

	// At a phone's width the page folds instead of overflowing: wide
	// tables scroll in their own box.
	run(t, tab, "narrow the window", chromedp.EmulateViewport(360, 800))
	if w := get(t, tab, "measure the page", chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`)); w[0] > w[1] {
		t.Errorf("at 360 px the run page is %d px wide: it overflows", w[0])
	}

	// What the page showed is what the daemon journaled.
	det, err := k.dial(t).GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	shown := get(t, tab, "count the events shown", chromedp.Evaluate[int](`document.querySelectorAll('#events li[data-seq]').length`))
	if det.Run.Status != keel.RunSucceeded || shown != len(det.Events) {
		t.Errorf("daemon: run %s with %d events; the page shows %d", det.Run.Status, len(det.Events), shown)
	}

	// Fork it from step 1: the page opens the new run, which holds the
	// copied steps (the call with its edited arguments) and goes on.
	run(t, tab, "fork from step 1",
		chromedp.EmulateViewport(1280, 900),
		chromedp.SetValue(css(`#fork-step`), "1"),
		chromedp.Click(css(`.steer button[data-action="fork"]`)),
		waitJS(`location.hash.startsWith('#/runs/') && location.hash !== `+"`#/runs/"+string(id)+"`"),
		visible(css(`#events li[data-type="run.forked"]`)),
		visible(css(`#events li[data-type="run.succeeded"]`)))
	if call := get(t, tab, "read the fork's tool call", textOf(css(`#events li[data-type="tool.call"] .sum`))); !strings.Contains(call, `{"text":"just two"}`) {
		t.Errorf("the fork's copied tool.call reads %q, want the edited arguments", call)
	}
}

// shot takes a screenshot of the whole page when they are asked for.
func shot(t *testing.T, tab context.Context) []byte {
	t.Helper()
	if !wantScreenshots() {
		return nil
	}
	return get(t, tab, "screenshot", chromedp.FullScreenshot(100))
}

// TestReconnectResumes follows a run on its page, breaks the page's
// connection, and has the run journal events around the break: the page
// reconnects, subscribes again after the last event it saw, and shows
// every event exactly once, in order.
func TestReconnectResumes(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil, scripted.Repeat(scripted.Block())), nil, false)
	c := k.dial(t)
	ctx := context.Background()
	r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "wait"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CancelRun(ctx, r.ID) })
	say := func(msg string) {
		t.Helper()
		if _, err := c.SayToRun(ctx, r.ID, msg); err != nil {
			t.Fatal(err)
		}
	}
	messages := func(n int) chromedp.Action[chromedp.Void] {
		return waitJS(fmt.Sprintf(`document.querySelectorAll('#events li[data-type="human.message"]').length >= %d`, n))
	}
	tab := newTab(t)
	login(t, tab, k)
	run(t, tab, "follow the run", chromedp.Navigate(k.base+"/#/runs/"+string(r.ID)),
		visible(css(`#events li[data-type="run.started"]`)))
	say("one")
	run(t, tab, "see the first message", messages(1))

	run(t, tab, "break the connection", chromedp.Evaluate[chromedp.Void](`window.keelConsole.conn.ws.close()`))
	say("two")
	run(t, tab, "reconnect", waitJS(`window.keelConsole.conn.opens >= 2 && window.keelConsole.conn.state === 'open'`))
	say("three")
	run(t, tab, "see the later messages", messages(3))

	det, err := c.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	seqs := get(t, tab, "read the events shown", chromedp.Evaluate[[]int64](`[...document.querySelectorAll('#events li[data-seq]')].map((li) => Number(li.dataset.seq))`))
	var want []int64
	for _, ev := range det.Events {
		want = append(want, ev.Seq)
	}
	if !slices.Equal(seqs, want) {
		t.Errorf("after a reconnect the page shows events %v, want each journaled one once, in order: %v", seqs, want)
	}
}
