package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

// Orchestration in the CLI: `keel run --dag FILE` and `keel run --plan`,
// and how `keel show` and `keel runs` show a run's kind and shape. See
// docs/orchestration.md.

// maxPlanFile bounds the plan file `keel run --dag` reads.
const maxPlanFile = 1 << 20

// kindFlags are the flags of `keel run` that choose the run's kind.
type kindFlags struct {
	dag  string // a file holding a keel.Plan as JSON; "-" is stdin
	plan bool
}

func (k *kindFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.dag, "dag", "", "run the steps of this plan file (JSON: {\"steps\":[{\"id\",\"goal\",\"tools\",\"depends_on\",\"retries\"}]}; - reads stdin) as a DAG of sub-agents")
	cmd.Flags().BoolVar(&k.plan, "plan", false, "planner-executor: the model plans the steps, keel runs them as sub-agents and re-plans when one fails")
}

// apply sets the kind and plan of p from the flags. A file that cannot be
// read or is not a plan is a usage error; the daemon checks the rest.
func (k *kindFlags) apply(cmd *cobra.Command, p *protocol.RunStartParams) error {
	switch {
	case k.dag != "" && k.plan:
		return &exitError{code: ExitUsage, err: errors.New("--dag and --plan exclude each other: give the steps, or let the model plan them")}
	case k.plan:
		p.Kind = keel.KindPlan
		return nil
	case k.dag == "":
		return nil
	}
	plan, err := readPlan(cmd.InOrStdin(), k.dag)
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--dag %s: %w", k.dag, err)}
	}
	p.Kind, p.Plan = keel.KindDAG, &plan
	return nil
}

// readPlan reads a keel.Plan from the file name ("-": stdin). Unknown
// fields are refused, so a misspelt "depends_on" is not silently lost.
func readPlan(stdin io.Reader, name string) (keel.Plan, error) {
	var r io.Reader = stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return keel.Plan{}, err
		}
		defer f.Close()
		r = f
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxPlanFile+1))
	if err != nil {
		return keel.Plan{}, err
	}
	if len(raw) > maxPlanFile {
		return keel.Plan{}, fmt.Errorf("larger than %d bytes", maxPlanFile)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var plan keel.Plan
	if err := dec.Decode(&plan); err != nil {
		return keel.Plan{}, fmt.Errorf("not a plan: %w", err)
	}
	if dec.More() {
		return keel.Plan{}, errors.New("not a plan: more than one JSON value")
	}
	if len(plan.Steps) == 0 {
		return keel.Plan{}, errors.New(`the plan has no steps: want {"steps":[{"id":"a","goal":"…"}]}`)
	}
	return plan, nil
}

// kindLabel is a run's kind as `keel runs` shows it.
func kindLabel(r keel.Run) string {
	if r.ParentID != "" {
		return "sub-agent"
	}
	return string(r.KindOrAgent())
}

// printFlowEvent renders the events of plan and DAG runs; false for any
// other event.
func printFlowEvent(w io.Writer, ev keel.Event) bool {
	switch ev.Type {
	case keel.EventPlanProposed:
		var d keel.PlanData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(w, "%3d plan revision %d: %d steps", ev.Seq, d.Revision, len(d.Plan.Steps))
		if d.Reason != "" {
			fmt.Fprintf(w, " (re-planned: %s)", clip(d.Reason, 300))
		}
		fmt.Fprintln(w)
		for _, s := range d.Plan.Steps {
			fmt.Fprintf(w, "      │ %s: %s%s\n", s.ID, clip(s.Goal, 200), stepNotes(s))
		}
	case keel.EventStepStarted:
		var d keel.StepData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(w, "%3d step  → %s attempt %d  sub-agent %s\n", ev.Seq, d.StepID, d.Attempt, d.Run)
	case keel.EventStepFinished:
		var d keel.StepData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(w, "%3d step  ← %s %s", ev.Seq, d.StepID, d.Status)
		if d.Error != "" {
			fmt.Fprintf(w, ": %s", clip(d.Error, 300))
		}
		fmt.Fprintln(w, labelNote(d.Labels))
		if d.Result != "" {
			fmt.Fprintf(w, "      │ %s\n", clip(d.Result, 300))
		}
	default:
		return false
	}
	return true
}

func stepNotes(s keel.PlanStep) string {
	var notes []string
	if len(s.DependsOn) > 0 {
		notes = append(notes, "after "+strings.Join(s.DependsOn, ", "))
	}
	if len(s.Tools) > 0 {
		notes = append(notes, "tools "+strings.Join(s.Tools, ", "))
	}
	if s.Retries > 0 {
		notes = append(notes, fmt.Sprintf("retries %d", s.Retries))
	}
	if len(notes) == 0 {
		return ""
	}
	return "  (" + strings.Join(notes, "; ") + ")"
}

// printShape writes a run's kind and shape for `keel show`: an agent
// run's model steps and tool calls, a sub-agent's parent and step, a plan
// or DAG run's plan with each step's dependencies, status, attempts and
// sub-agent. The status of a step whose sub-agent is still going is the
// sub-agent's own (it may be waiting for a person), read from the daemon.
func printShape(ctx context.Context, c *client.Client, w io.Writer, d protocol.RunDetail) {
	r := d.Run
	fmt.Fprintf(w, "kind    %s\n", r.KindOrAgent())
	if r.ParentID != "" {
		fmt.Fprintf(w, "parent  %s (step %s)\n", r.ParentID, r.ParentStep)
	}
	if r.KindOrAgent() == keel.KindAgent {
		steps, calls := 0, 0
		for _, ev := range d.Events {
			switch ev.Type {
			case keel.EventModelResult:
				steps++
			case keel.EventToolResult:
				calls++
			}
		}
		fmt.Fprintf(w, "shape   %d model steps, %d tool calls\n", steps, calls)
		return
	}
	var plan keel.PlanData
	hasPlan := false
	type stepState struct {
		last     keel.StepData
		goal     string // of the step when it last started
		attempts int
		finished bool
	}
	steps := map[string]*stepState{}
	for _, ev := range d.Events {
		switch ev.Type {
		case keel.EventPlanProposed:
			_ = json.Unmarshal(ev.Data, &plan)
			hasPlan = true
		case keel.EventStepStarted, keel.EventStepFinished:
			var sd keel.StepData
			if json.Unmarshal(ev.Data, &sd) != nil {
				continue
			}
			s := steps[sd.StepID]
			if s == nil {
				s = &stepState{}
				steps[sd.StepID] = s
			}
			if ev.Type == keel.EventStepStarted {
				s.attempts++
				s.last, s.finished = sd, false
				for _, ps := range plan.Plan.Steps {
					if ps.ID == sd.StepID {
						s.goal = ps.Goal
					}
				}
			} else if sd.Run == s.last.Run {
				s.last, s.finished = sd, true
			}
		}
	}
	if !hasPlan {
		fmt.Fprintln(w, "shape   no plan yet")
		return
	}
	fmt.Fprintf(w, "shape   plan revision %d, %d steps", plan.Revision, len(plan.Plan.Steps))
	if plan.Reason != "" {
		fmt.Fprintf(w, " (re-planned: %s)", clip(plan.Reason, 200))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tDEPENDS ON\tTOOLS\tSTATUS\tATTEMPTS\tSUB-AGENT")
	for _, ps := range plan.Plan.Steps {
		status, attempts, sub := "pending", 0, "-"
		if s := steps[ps.ID]; s != nil {
			attempts, sub = s.attempts, string(s.last.Run)
			switch {
			case s.goal != ps.Goal:
				status = "pending" // the re-plan changed the step: it runs again
			case s.finished:
				status = string(s.last.Status)
			default:
				status = "running"
				if child, err := c.GetRun(ctx, s.last.Run); err == nil {
					status = string(child.Run.Status)
				}
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", ps.ID, orDash(strings.Join(ps.DependsOn, ",")), orDash(strings.Join(ps.Tools, ",")), status, attempts, sub)
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
