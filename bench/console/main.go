// Command console measures the web console's event latency: the time
// from an event's journal commit in the daemon to its node in the DOM of
// a real browser, with many runs streaming at once.
//
// It starts a daemon (scripted model, no tools) on a temp data dir,
// starts -runs runs whose model call never ends (so each stays running),
// logs a headless Chromium in with a one-time code (as keel open does)
// and opens the console's live page (#/live?record=1), which follows
// every run that has not ended. Then each run gets a message (run.say,
// journaled as a human.message event) every -interval, with a random
// phase, for -duration. The page records, as it inserts each event's
// node, performance.timeOrigin + performance.now(). Browser and daemon
// share the machine's clock. An event carries the time the engine
// stamped on it just before its commit (which waits its turn at the
// database), so "shown minus the event's time" is an upper bound of the
// latency from the commit; "shown minus when run.say's answer came
// back" (after the commit) is a lower bound. The true figure lies
// between. A Go client following the same runs over the protocol gives
// the daemon's share (stamp to a native client).
//
//	go run ./bench/console [-runs 100] [-interval 1s] [-duration 20s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

func main() {
	runs := flag.Int("runs", 100, "runs streaming at once")
	interval := flag.Duration("interval", time.Second, "time between two events of one run")
	duration := flag.Duration("duration", 20*time.Second, "how long the runs stream")
	browser := flag.String("chromium", "", "the browser (default: chromium or chromium-browser on PATH)")
	flag.Parse()
	if err := run(*runs, *interval, *duration, *browser); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// mark is what the page records for each event it shows.
type mark struct {
	Run       string  `json:"run"`
	Seq       int64   `json:"seq"`
	Type      string  `json:"type"`
	Journaled float64 `json:"journaled"` // ms since the epoch
	Received  float64 `json:"received"`  // its frame arrived
	Shown     float64 `json:"shown"`     // its node was inserted
}

func run(runs int, interval, duration time.Duration, browser string) error {
	if browser == "" {
		for _, name := range []string{"chromium", "chromium-browser"} {
			if p, err := exec.LookPath(name); err == nil {
				browser = p
				break
			}
		}
		if browser == "" {
			return errors.New("no chromium on PATH (apt-get install chromium), or pass -chromium")
		}
	}
	dir, err := os.MkdirTemp("", "keel-bench-console-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan protocol.DaemonInfo, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, Addr: "127.0.0.1:0",
			Provider: scripted.New(nil, scripted.Repeat(scripted.Block())),
			Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:    func(i protocol.DaemonInfo) { ready <- i }})
	}()
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("daemon: %w", err)
	}
	defer func() { cancel(); <-done }()
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return err
	}
	defer c.Close()

	ids := make([]keel.RunID, runs)
	for i := range ids {
		r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: fmt.Sprintf("stream %d", i)})
		if err != nil {
			return err
		}
		ids[i] = r.ID
	}
	// A native client follows the same runs, for comparison: what the
	// protocol costs without the browser.
	obs, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return err
	}
	defer obs.Close()
	for _, id := range ids {
		if _, err := obs.Subscribe(ctx, id, 0); err != nil {
			return err
		}
	}
	var native []float64
	var nativeMu sync.Mutex
	var start time.Time
	var started atomic.Bool
	go func() {
		for ev := range obs.Events() {
			if ev.Type == keel.EventHumanMessage && started.Load() && ev.Time.After(start) {
				d := float64(time.Since(ev.Time).Microseconds()) / 1000
				nativeMu.Lock()
				native = append(native, d)
				nativeMu.Unlock()
			}
		}
	}()

	login, err := client.Do(ctx, c, client.ConsoleLogin, client.None{})
	if err != nil {
		return err
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.WindowSize(1280, 900))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(alloc)
	defer cancelTab()
	if err := chromedp.Do(tab); err != nil {
		return fmt.Errorf("start chromium: %w", err)
	}
	wait, cancelWait := context.WithTimeout(tab, time.Minute)
	defer cancelWait()
	following := fmt.Sprintf(`document.querySelector('#live-count')?.textContent.startsWith('Following %d runs')`, runs)
	if err := chromedp.Do(wait,
		chromedp.Navigate(login.URL),
		chromedp.WaitVisible(chromedp.CSS(`#conn[data-state="open"]`)),
		chromedp.Navigate("http://"+hostOf(login.URL)+"/#/live?record=1"),
		chromedp.Poll[chromedp.Void](following, chromedp.WithPollingTimeout(time.Minute)),
	); err != nil {
		return fmt.Errorf("open the live page: %w", err)
	}
	// Every run's subscription is answered once a first message to each
	// shows up.
	for _, id := range ids {
		if _, err := c.SayToRun(ctx, id, "warm up"); err != nil {
			return err
		}
	}
	if err := chromedp.Do(wait, chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.keelConsole.marks.length >= %d`, runs), chromedp.WithPollingTimeout(time.Minute))); err != nil {
		return fmt.Errorf("the page shows not every run's first event: %w", err)
	}

	// Stream: each run gets a message every interval, from a random phase.
	start = time.Now()
	started.Store(true)
	var sent atomic.Int64
	// acked[run/seq] is when run.say's answer came back: after the
	// event's commit, so shown minus it is a lower bound of the latency
	// from commit, as shown minus the event's time is an upper bound.
	var ackMu sync.Mutex
	acked := map[string]time.Time{}
	var wg sync.WaitGroup
	errc := make(chan error, runs)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(rand.N(interval))
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 0; time.Since(start) < duration; n++ {
				r, err := c.SayToRun(ctx, id, fmt.Sprintf("message %d", n))
				if err != nil {
					errc <- err
					return
				}
				at := time.Now()
				ackMu.Lock()
				acked[fmt.Sprintf("%s/%d", id, r.LastSeq)] = at
				ackMu.Unlock()
				sent.Add(1)
				<-tick.C
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	want := int64(runs) + sent.Load()
	if err := chromedp.Do(wait, chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.keelConsole.marks.length >= %d`, want), chromedp.WithPollingTimeout(time.Minute))); err != nil {
		return fmt.Errorf("the page did not show all %d events: %w", want, err)
	}
	marks, err := chromedp.Run(wait, chromedp.Evaluate[[]mark](`window.keelConsole.marks`))
	if err != nil {
		return err
	}
	startMS := float64(start.UnixNano()) / 1e6
	var lat, page, low []float64
	for _, m := range marks {
		if m.Type == string(keel.EventHumanMessage) && m.Journaled >= startMS {
			lat = append(lat, m.Shown-m.Journaled)
			page = append(page, m.Shown-m.Received)
			if at, ok := acked[fmt.Sprintf("%s/%d", m.Run, m.Seq)]; ok {
				low = append(low, m.Shown-float64(at.UnixNano())/1e6)
			}
		}
	}
	if len(lat) == 0 {
		return errors.New("no events measured")
	}
	slices.Sort(lat)
	slices.Sort(page)
	q := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	pq := func(p float64) float64 { return page[min(len(page)-1, int(p*float64(len(page))))] }
	slices.Sort(low)
	nativeMu.Lock()
	slices.Sort(native)
	nq := func(p float64) float64 { return native[min(len(native)-1, int(p*float64(len(native))))] }
	defer nativeMu.Unlock()
	fmt.Printf("console event latency, journal commit to browser DOM (%s, %s)\n", browserVersion(browser), "live page")
	fmt.Printf("runs %d, one event per run every %s for %s: %d events, %.0f events/s\n",
		runs, interval, duration, len(lat), float64(len(lat))/duration.Seconds())
	fmt.Printf("event time to browser DOM (upper bound): p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms\n", q(0.50), q(0.90), q(0.99), lat[len(lat)-1])
	fmt.Printf("  in the page, frame handled to node inserted: p50 %.2f ms  p99 %.2f ms\n", pq(0.50), pq(0.99))
	if len(low) > 0 {
		lq := func(p float64) float64 { return low[min(len(low)-1, int(p*float64(len(low))))] }
		fmt.Printf("run.say answered (after the commit) to browser DOM (lower bound): p50 %.1f ms  p99 %.1f ms (%d events)\n", lq(0.50), lq(0.99), len(low))
	}
	if len(native) > 0 {
		fmt.Printf("event time to a native Go client: p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms (%d events, Go client of the same runs)\n",
			nq(0.50), nq(0.90), nq(0.99), native[len(native)-1], len(native))
	}
	return nil
}

// hostOf returns the host:port of an http URL.
func hostOf(u string) string {
	rest := u[len("http://"):]
	for i, c := range rest {
		if c == '/' {
			return rest[:i]
		}
	}
	return rest
}

func browserVersion(path string) string {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return path
	}
	return string(out[:len(out)-1])
}
