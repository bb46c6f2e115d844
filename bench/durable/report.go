package main

import (
	"fmt"
	"time"
)

// report prints the figures of both columns side by side, then the ratios
// against the targets.
func report(cfg config, dir, where string, cols []*column, wait keelWaiting) {
	fmt.Printf("durable steps: %d per run; database files in %s (%s), all on one disk\n", cfg.n, dir, where)
	fmt.Printf("SQLite %s through modernc.org/sqlite (floor and keel)", cols[0].floor.sqlite)
	if cfg.skipLang {
		fmt.Println("; LangGraph.js skipped")
	} else {
		v := cols[0].lg.Versions
		fmt.Printf(", SQLite %s through better-sqlite3 %s (LangGraph.js)\n", v["sqlite"], v["better-sqlite3"])
		fmt.Printf("LangGraph.js: @langchain/langgraph %s, @langchain/langgraph-checkpoint-sqlite %s, Node %s, durability %q\n",
			v["@langchain/langgraph"], v["@langchain/langgraph-checkpoint-sqlite"], v["node"], cols[0].lg.Durability)
	}
	fmt.Println("both sides: journal_mode=WAL, synchronous set explicitly to each column's value")
	fmt.Println()

	row := func(label string, f func(c *column) string) {
		fmt.Printf("%-64s", label)
		for _, c := range cols {
			fmt.Printf(" %20s", f(c))
		}
		fmt.Println()
	}
	lg := func(f func(c *column) string) func(c *column) string {
		if cfg.skipLang {
			return func(*column) string { return "skipped" }
		}
		return f
	}
	row("", func(c *column) string { return "synchronous=" + c.sync })
	row("floor: one SQLite commit, p50", func(c *column) string { return dur(c.floor.p50) })
	row("floor: one SQLite commit, mean", func(c *column) string { return dur(c.floor.mean) })
	row("keel, one run: per step", func(c *column) string { return dur(c.keel.perStep) })
	row("keel, one run: per journaled event", func(c *column) string { return dur(c.keel.perEvent) })
	row("keel, one run: journaled events per step", func(c *column) string {
		return fmt.Sprintf("%.2f", float64(c.keel.events)/float64(cfg.n))
	})
	row("keel, one run: SQLite commits per step", func(c *column) string {
		return fmt.Sprintf("%.2f", float64(c.keel.commits)/float64(cfg.n))
	})
	row("LangGraph.js, one run: per step", lg(func(c *column) string {
		return dur(time.Duration(c.lg.Single.MSPerStep * float64(time.Millisecond)))
	}))
	row("LangGraph.js, one run: SQLite commits per step", lg(func(c *column) string {
		return fmt.Sprintf("%.2f", c.lg.Transactions.CommitsPerStep)
	}))
	row("keel, one run: per commit", func(c *column) string {
		return dur(time.Duration(float64(c.keel.perStep) * float64(cfg.n) / float64(c.keel.commits)))
	})
	row("keel step / floor mean (unpaired)", func(c *column) string {
		return ratio(float64(c.keel.perStep), float64(c.floor.mean))
	})
	row("keel commit / floor mean", func(c *column) string {
		return ratio(float64(c.keel.perStep)*float64(cfg.n)/float64(c.keel.commits), float64(c.floor.mean))
	})
	row(fmt.Sprintf("keel step / floor, paired, median of %d (target ≤ 1.2 at FULL)", cfg.reps), func(c *column) string { return fmt.Sprintf("%.2fx", c.keel.stepRatio) })
	row(fmt.Sprintf("same, until the run's trace is on disk too, median of %d", cfg.reps), func(c *column) string { return fmt.Sprintf("%.2fx", c.keel.tracedRatio) })
	row(fmt.Sprintf("keel commit / floor, paired, median of %d", cfg.reps), func(c *column) string { return fmt.Sprintf("%.2fx", c.keel.commitRatio) })
	row("LangGraph.js step / floor mean", lg(func(c *column) string {
		return ratio(c.lg.Single.MSPerStep*float64(time.Millisecond), float64(c.floor.mean))
	}))
	for _, n := range cfg.conc {
		fmt.Println()
		keel := func(f func(m keelMany) string) func(c *column) string {
			return func(c *column) string {
				if m, ok := c.keelC[n]; ok {
					return f(m)
				}
				return fmt.Sprintf("skipped (~%v)", c.projected[fmt.Sprintf("keel %d", n)].Round(time.Second))
			}
		}
		lang := func(c *column) (float64, string) {
			if r, ok := c.lgC[n]; ok {
				return r, fmt.Sprintf("%.0f", r)
			}
			return 0, fmt.Sprintf("skipped (~%v)", c.projected[fmt.Sprintf("langgraph %d", n)].Round(time.Second))
		}
		row(fmt.Sprintf("keel, %d runs: steps/s", n), keel(func(m keelMany) string { return fmt.Sprintf("%.0f", m.stepsPerS) }))
		row(fmt.Sprintf("keel, %d runs: journaled events/s", n), keel(func(m keelMany) string { return fmt.Sprintf("%.0f", m.eventsPerS) }))
		row(fmt.Sprintf("LangGraph.js, %d runs: steps/s", n), lg(func(c *column) string { _, s := lang(c); return s }))
		label := fmt.Sprintf("keel ÷ LangGraph.js steps/s, %d runs", n)
		if n == 100 {
			label += " (target ≥ 10)"
		}
		row(label, lg(func(c *column) string {
			m, ok := c.keelC[n]
			r, _ := lang(c)
			if !ok || r == 0 {
				return "-"
			}
			return ratio(m.stepsPerS, r)
		}))
	}
	fmt.Println()
	row(fmt.Sprintf("keel, resume %d interrupted runs: all launched", cfg.resume), func(c *column) string { return dur(c.resume.launched) })
	row(fmt.Sprintf("keel, resume %d interrupted runs: all succeeded", cfg.resume), func(c *column) string { return dur(c.resume.ended) })
	fmt.Println()
	fmt.Printf("keel, %d runs waiting for approval (FULL): %.0f bytes of live Go heap and %.2f goroutines per waiting run\n",
		wait.runs, wait.heapPerRun, wait.goroutinesPer)
	fmt.Println("a keel step is a model call and a call of a read-only tool, journaled as model.result, tool.call and")
	fmt.Println("tool.result in one commit after the tool ran and before the model sees its result (a tool that must not")
	fmt.Println("run twice costs two: its intent is committed before it starts);")
	fmt.Println("a LangGraph.js step is one node, checkpointed (its writes, then the checkpoint) before the next starts.")
}

// dur prints d in ms, or µs below a millisecond.
func dur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func ratio(a, b float64) string { return fmt.Sprintf("%.2fx", a/b) }
