package browsertest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestSteerInBrowser steers a run with the run page's controls: says
// something to it, takes it over and hands it back with a note, cancels
// it, then replays it. Each control's outcome is in the journal and
// shows up among the page's events; the replay's verdict is the
// daemon's.
func TestSteerInBrowser(t *testing.T) {
	t.Parallel()
	k := startKeel(t, scripted.New(nil, scripted.Repeat(scripted.Block())), nil, false)
	c := k.dial(t)
	ctx := context.Background()
	r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "take your time"})
	if err != nil {
		t.Fatal(err)
	}
	tab := newTab(t)
	login(t, tab, k)
	event := func(typ string) chromedp.Action[chromedp.Void] {
		return visible(css(`#events li[data-type="` + typ + `"]`))
	}
	run(t, tab, "open the run", chromedp.Navigate(k.base+"/#/runs/"+string(r.ID)), event("run.started"),
		enabled(css(`.steer button:not([disabled])`)))
	click := func(action string) chromedp.Action[chromedp.Void] {
		return chromedp.Click(css(`.steer button[data-action="` + action + `"]`))
	}
	run(t, tab, "say", chromedp.SendKeys(css(`#say-text`), "only look, do not touch"), click("say"), event("human.message"))
	run(t, tab, "take over", chromedp.SendKeys(css(`#control-note`), "checking"), click("takeover"), event("human.takeover"),
		visible(css(`.steer[data-taken-over="true"]`)))
	run(t, tab, "hand back", click("handback"), event("human.handback"),
		visible(css(`.steer[data-taken-over="false"]`)))
	run(t, tab, "cancel", click("cancel"), event("run.cancelled"),
		visible(css(`#waterfall[data-status="cancelled"]`)))
	run(t, tab, "replay", enabled(css(`.steer button[data-action="replay"]`)),
		click("replay"), visible(css(`.steer .replay p`)))
	replay := get(t, tab, "read the replay's outcome", textOf(css(`.steer .replay p`)))
	// A run cancelled inside a model call replays to the same end (the
	// replay is cancelled where the journal has no result); the page says
	// what the daemon found.
	check, err := client.Do(ctx, c, client.RunReplay, protocol.RunRef{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if want := "Replay matches the journal."; !check.Matches || replay != want {
		t.Errorf("replay on the page says %q (daemon: matches %v, %q), want %q", replay, check.Matches, check.Difference, want)
	}

	det, err := c.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	var types []keel.EventType
	var said keel.HumanMessageData
	for _, ev := range det.Events {
		types = append(types, ev.Type)
		if ev.Type == keel.EventHumanMessage {
			if err := jsonUnmarshal(ev.Data, &said); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, want := range []keel.EventType{keel.EventHumanMessage, keel.EventTakeOver, keel.EventHandBack, keel.EventRunCancelled} {
		if !slices.Contains(types, want) {
			t.Errorf("journal %v lacks %s", types, want)
		}
	}
	if said.Content != "only look, do not touch" {
		t.Errorf("journaled message %q, want what was typed", said.Content)
	}
}

// TestPlanGraphInBrowser runs a DAG of three steps and checks the run
// page's graph: a node per step, edges for the dependencies, and each
// step's final state written in its node.
func TestPlanGraphInBrowser(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	k := startKeel(t, p, nil, false)
	r, err := k.dial(t).StartRun(context.Background(), protocol.RunStartParams{Goal: "three steps", Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "fetch", Goal: "fetch"}, {ID: "check", Goal: "check", DependsOn: []string{"fetch"}},
		{ID: "report", Goal: "report", DependsOn: []string{"fetch", "check"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	tab := newTab(t)
	login(t, tab, k)
	run(t, tab, "see the finished plan", chromedp.Navigate(k.base+"/#/runs/"+string(r.ID)),
		visible(css(`#events li[data-type="run.succeeded"]`)),
		visible(css(`svg.dag g.node[data-step="report"]`)))
	states := get(t, tab, "read the graph", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('svg.dag g.node')].map((g) => g.dataset.step + ':' + g.querySelector('.node-state').textContent)`))
	if want := []string{"fetch:succeeded", "check:succeeded", "report:succeeded"}; !slices.Equal(states, want) {
		t.Errorf("graph nodes %v, want %v", states, want)
	}
	if edges := get(t, tab, "count the edges", chromedp.Evaluate[int](`document.querySelectorAll('svg.dag path.edge').length`)); edges != 3 {
		t.Errorf("graph has %d edges, want 3 (one per dependency)", edges)
	}
}

// TestPauseResumeInBrowser pauses a run with the page's button while its
// model is thinking: the run stops at the next step boundary, before its
// tool call, and the page lets it go on with Resume.
func TestPauseResumeInBrowser(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: tally, Arguments: []byte(`{"text":"a b"}`)}}}}, nil
		}),
		scripted.Answer("two words"),
	)
	k := startKeel(t, p, nil, true)
	r, err := k.dial(t).StartRun(context.Background(), protocol.RunStartParams{Goal: "count"})
	if err != nil {
		t.Fatal(err)
	}
	tab := newTab(t)
	login(t, tab, k)
	run(t, tab, "pause while the model thinks", chromedp.Navigate(k.base+"/#/runs/"+string(r.ID)),
		visible(css(`#events li[data-type="run.started"]`)),
		enabled(css(`.steer button[data-action="pause"]`)),
		chromedp.Click(css(`.steer button[data-action="pause"]`)),
		visible(css(`.steer .alert[data-kind="ok"]`)))
	close(release)
	run(t, tab, "see it paused, then resume it",
		visible(css(`#events li[data-type="run.paused"]`)),
		enabled(css(`.steer button[data-action="resume"]`)),
		chromedp.Click(css(`.steer button[data-action="resume"]`)),
		visible(css(`#events li[data-type="run.succeeded"]`)))
	types := get(t, tab, "read the events", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#events li[data-seq]')].map((li) => li.dataset.type)`))
	paused, called := slices.Index(types, "run.paused"), slices.Index(types, "tool.result")
	if paused < 0 || called < paused {
		t.Errorf("events %v: want the run paused before its tool ran", types)
	}
}
