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
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// approve approves run id's pending call callID as it is, through the
// daemon (as another client would).
func approve(t *testing.T, c *client.Client, id keel.RunID, callID string) {
	t.Helper()
	ctx := context.Background()
	det, err := c.GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range det.Events {
		var d keel.ApprovalRequestData
		if ev.Type != keel.EventApprovalAsked || json.Unmarshal(ev.Data, &d) != nil || d.Call.ID != callID {
			continue
		}
		if _, err := c.ApproveRun(ctx, protocol.RunApproveParams{RunID: id, CallID: callID, ArgsSHA256: d.ArgsSHA256, Approved: true}); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("run %s asks no approval of call %s", id, callID)
}

// TestRunsPageLive keeps the runs page open while runs start, wait,
// are approved and end behind its back: each change shows up, in the
// filtered view too, while the page reads the list only when it opens
// and when a filter changes (runs.changed, no polling), and an idle page
// keeps no timer.
func TestRunsPageLive(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: tally, Arguments: json.RawMessage(`{"text":"a b"}`)}),
		scripted.Repeat(scripted.Answer("done")))
	k := startKeel(t, p, []keel.SideEffect{keel.SideEffectReadOnly}, true)
	c := k.dial(t)
	ctx := context.Background()
	tab := newTab(t)
	login(t, tab, k)
	shown := func(n int) chromedp.Action[chromedp.Void] {
		return waitJS(fmt.Sprintf(`document.querySelectorAll('#runs tr a').length === %d && (%[1]d > 0 || document.querySelector('#runs')?.textContent === 'No runs match.')`, n))
	}
	row := func(id keel.RunID, state string) chromedp.Action[chromedp.Void] {
		return waitJS(fmt.Sprintf(`[...document.querySelectorAll('#runs tr')].some((tr) => tr.querySelector('a')?.textContent === %q && tr.querySelector('.status')?.textContent === %q)`, id, state))
	}
	filter := func(name, value string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(
			`(() => { const s = document.querySelector('form.filters select[name=%q]'); s.value = %q; s.dispatchEvent(new Event('change')); })()`, name, value))
	}
	run(t, tab, "open the runs page", shown(0))
	lists := 2 // the page's and the inbox count's

	r1, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count a b"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, tab, "see the run wait", row(r1.ID, "waiting"))
	run(t, tab, "filter on waiting", filter("state", "waiting"), row(r1.ID, "waiting"), shown(1))
	lists++
	approve(t, c, r1.ID, "c1")
	run(t, tab, "see it leave the waiting runs", shown(0))
	run(t, tab, "filter on succeeded", filter("state", "succeeded"), row(r1.ID, "succeeded"), shown(1))
	lists++
	r2, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "say done"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, tab, "see the second run end", row(r2.ID, "succeeded"), shown(2))
	run(t, tab, "filter on a kind", filter("kind", "dag"), shown(0), filter("kind", "agent"), shown(2))
	lists += 2
	model := func(v string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const m = document.querySelector('form.filters input[name="model"]'); m.value = %q; m.dispatchEvent(new Event('input')); })()`, v))
	}
	run(t, tab, "filter on a model", model("no-such-model"), shown(0), model(""), shown(2))

	if n := sent(t, tab, protocol.MethodRunList); n != lists {
		t.Errorf("the page sent run.list %d times, want %d: once when it opened, once per filter change, never to poll\n%s", n, lists,
			get(t, tab, "list the requests", chromedp.Evaluate[string](`JSON.stringify(window.keelTest.sent)`)))
	}
	if n := get(t, tab, "count the timers", chromedp.Evaluate[int](`window.keelTest.timers()`)); n != 0 {
		t.Errorf("the idle runs page keeps %d timers, want none", n)
	}
}

// TestTwoBrowsers has two browsers, each logged in with its own
// session, watch the same run: both see its events as they happen; the
// second opens its inbox, where the call waits; the first approves the
// call on its run page; the second's inbox drops the call as the
// decision is journaled (told, not polling), and its run page then shows
// the result. Neither browser loses or repeats an event.
func TestTwoBrowsers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: tally, Arguments: json.RawMessage(`{"text":"a b"}`)}}}}, nil
		}),
		scripted.Answer("two words"))
	k := startKeel(t, p, []keel.SideEffect{keel.SideEffectReadOnly}, true)
	c := k.dial(t)
	ctx := context.Background()
	r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count a b"})
	if err != nil {
		t.Fatal(err)
	}
	runURL := k.base + "/#/runs/" + string(r.ID)
	event := func(typ string) chromedp.Action[chromedp.Void] {
		return visible(css(`#events li[data-type="` + typ + `"]`))
	}

	first, second := newTab(t), newTab(t)
	login(t, first, k)
	login(t, second, k)
	if a, b := sessionCookie(t, first, k), sessionCookie(t, second, k); a.Value == b.Value {
		t.Fatal("the two browsers share a session")
	}
	for _, tab := range []context.Context{first, second} {
		run(t, tab, "open the run", chromedp.Navigate(runURL), event("run.started"))
	}
	close(release)
	for _, tab := range []context.Context{first, second} {
		run(t, tab, "see the call wait, live", event("approval.requested"), visible(css(`article.wait[data-call="c1"] button.approve`)))
	}
	run(t, second, "open the inbox", chromedp.Navigate(k.base+"/#/approvals"),
		visible(css(`#inbox article.wait[data-call="c1"]`)))
	reads := sent(t, second, protocol.MethodRunList, protocol.MethodRunGet)

	run(t, first, "approve on the run page", chromedp.Click(css(`article.wait[data-call="c1"] button.approve`)), event("run.succeeded"))
	run(t, second, "see the call leave the inbox", waitJS(`!document.querySelector('#inbox article.wait') && document.querySelector('#inbox')?.previousElementSibling?.textContent === 'Nothing waits for you.'`))
	if n := sent(t, second, protocol.MethodRunList, protocol.MethodRunGet); n != reads {
		t.Errorf("the inbox read the runs %d more times to drop the answered call, want it told (runs.changed, run.event), not polling", n-reads)
	}
	run(t, second, "see the result on the run page", chromedp.Navigate(runURL), event("approval.decision"), event("run.succeeded"),
		waitJS(`document.querySelector('.facts .result')?.textContent.includes('two words')`))

	det, err := c.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	var want []int64
	for _, ev := range det.Events {
		want = append(want, ev.Seq)
	}
	for name, tab := range map[string]context.Context{"first": first, "second": second} {
		seqs := get(t, tab, "read the events shown", chromedp.Evaluate[[]int64](`[...document.querySelectorAll('#events li[data-seq]')].map((li) => Number(li.dataset.seq))`))
		if !slices.Equal(seqs, want) {
			t.Errorf("the %s browser shows events %v, want each journaled one once, in order: %v", name, seqs, want)
		}
		if d := get(t, tab, "read the approval", textOf(css(`#events li[data-type="approval.decision"] .sum`))); !strings.Contains(d, "approved") {
			t.Errorf("the %s browser shows the decision as %q", name, d)
		}
	}
}
