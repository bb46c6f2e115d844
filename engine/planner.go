package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// The planner: the model step that proposes (and revises) a plan run's
// plan, each of its calls a trace span.

const plannerPrompt = "You are the planner of a keel run. Break the goal into a small plan of steps. " +
	"Each step is carried out by a separate agent that sees only its own goal, the results of the steps it depends on, " +
	"and the tools you list for it (none when you list none). Steps that do not depend on each other run in parallel. " +
	"Give each step a short id (letters, digits, '-' or '_'), a goal that says exactly what to do and what to report, " +
	"the tools it needs, and the ids of the steps whose results it needs in depends_on. Reply with only the JSON plan."

const composePrompt = "You write the final answer of a keel run from the results of the steps that carried it out. " +
	"Answer the goal directly, using the results; do not describe the steps."

// propose asks the planner for a plan (why empty) or a revised plan after
// a failed step (why says which and how), journals the accepted reply as
// a model.result and the plan as plan.proposed. A reply journaled before
// the daemon stopped is used instead of asking again.
func (f *flowRun) propose(ctx context.Context, why string) error {
	specs := f.e.toolsFor(ctx, f.run, f.e.cfg.Tools.Specs(ctx))
	revision := 0
	if f.st.hasPlan {
		revision = f.st.revision + 1
	}
	var plan keel.Plan
	if p := f.st.pending; p != nil {
		if err := json.Unmarshal([]byte(p.Content), &plan); err != nil {
			return fmt.Errorf("the journaled plan of model step %d: %w", p.Step, err)
		}
		if err := f.e.checkPlan(ctx, plan, f.run.Policy.Tools); err != nil {
			return fmt.Errorf("the journaled plan of model step %d: %w", p.Step, err)
		}
	} else {
		if f.e.paused(ctx, f.run.ID) {
			return errPausedFlow
		}
		var err error
		if plan, err = f.askPlanner(ctx, specs, why); err != nil {
			return err
		}
	}
	return f.appendEvent(ctx, keel.EventPlanProposed, keel.PlanData{Plan: plan, Revision: revision, Reason: why}, nil)
}

// errPausedFlow is not an error: the run paused before a planner step.
var errPausedFlow = errors.New("paused")

func ignorePause(err error) error {
	if errors.Is(err, errPausedFlow) {
		return nil
	}
	return err
}

// askPlanner makes one journaled model step whose reply is a valid plan.
func (f *flowRun) askPlanner(ctx context.Context, specs []keel.ToolSpec, why string) (keel.Plan, error) {
	var catalog strings.Builder
	if len(specs) == 0 {
		catalog.WriteString("\n\nNo tools are available: every step works from its goal and its dependencies' results.")
	} else {
		catalog.WriteString("\n\nTools the steps may use:")
		for _, s := range specs {
			fmt.Fprintf(&catalog, "\n- %s: %s", s.Name, s.Description)
		}
	}
	// The goal and the steps' results carry the context's labels.
	labels := labelNames(f.e.labelsNow(ctx, f.run))
	msgs := []models.Message{
		{Role: models.RoleSystem, Content: plannerPrompt + fmt.Sprintf(" Use at most %d steps.", MaxPlanSteps)},
		{Role: models.RoleUser, Content: "Goal: " + f.run.Goal + catalog.String(), Labels: labels},
	}
	if why != "" {
		prev, _ := json.Marshal(f.st.plan)
		msgs = append(msgs, models.Message{Role: models.RoleUser, Labels: labels, Content: fmt.Sprintf(
			"The plan so far (revision %d) was:\n%s\n\n%s\n\nThe run stopped at: %s.\n\n"+
				"Propose a revised plan for the whole goal. A step whose id and goal are exactly those of a step that succeeded "+
				"is not run again: its result is reused.", f.st.revision, prev, f.resultsText(), why)})
	}
	schemaJSON := planSchema(specs)
	step := f.st.modelSteps + 1
	chat := &spanChatter{f: f, step: step}
	req := models.ChatRequest{Model: f.run.Model, Messages: msgs, AllowCloud: f.run.Policy.AllowCloud, Labels: labels, Budget: f.budget(ctx)}
	for attempt := 0; ; attempt++ {
		res, err := models.Structured(ctx, chat, req, schemaJSON, models.DefaultRepairs)
		if err != nil {
			return keel.Plan{}, fmt.Errorf("planner: model %s: %w", f.run.Model, err)
		}
		var plan keel.Plan
		problem := ""
		if err := json.Unmarshal(res.Value, &plan); err != nil {
			problem = err.Error()
		} else if err := f.e.checkPlan(ctx, plan, f.run.Policy.Tools); err != nil {
			problem = strings.TrimSuffix(err.Error(), ": "+keel.ErrInvalid.Error())
		}
		if problem == "" {
			// The accepted reply is journaled before it is used.
			if err := f.appendEvent(ctx, keel.EventModelResult, keel.ModelResultData{Step: step, Model: res.Response.Model,
				Content: string(res.Value), PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens, Labels: req.LabelSet(),
				DurationMS: chat.took.Milliseconds()}, nil); err != nil {
				return keel.Plan{}, err
			}
			return plan, nil
		}
		if attempt >= planRepairs {
			return keel.Plan{}, fmt.Errorf("planner: %d plans were not valid; the last: %s", attempt+1, problem)
		}
		req.Messages = append(slices.Clone(req.Messages),
			models.Message{Role: models.RoleAssistant, Content: string(res.Value)},
			models.Message{Role: models.RoleUser, Content: "That plan is not valid: " + problem + ". Reply again with a corrected plan, only JSON."})
	}
}

// spanChatter makes each of the planner's model calls a trace span, so
// what it spends counts against the run's budget across restarts. The
// accepted reply is journaled by askPlanner, once.
type spanChatter struct {
	f    *flowRun
	step int
	took time.Duration
}

func (c *spanChatter) Chat(ctx context.Context, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	e, run := c.f.e, c.f.run
	sp := e.newSpan(run.ID, keel.SpanModelCall, run.Model, c.step)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	start := e.cfg.Now()
	resp, err := e.model(run, c.step).Chat(ctx, req, nil)
	e.endModelSpan(run.ID, &sp, start, req, resp, err)
	c.took += sp.Duration
	// No event records what a planner call spent: its span does, so it
	// is made durable before the planner goes on.
	if ferr := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); ferr != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", ferr)
	}
	if ferr := e.cfg.Store.Sync(context.WithoutCancel(ctx)); ferr != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", ferr)
	}
	return resp, err
}
