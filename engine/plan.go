package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
)

// A plan's limits, its validation and the JSON Schema the planner replies in.

// Limits of a plan, checked by Start (a DAG's plan) and on every plan the
// planner proposes.
const (
	// MaxPlanSteps is the most steps a plan may have.
	MaxPlanSteps = 32
	// MaxStepRetries is the largest per-step retry count.
	MaxStepRetries = 5
	// maxStepGoal bounds a step's goal, in bytes.
	maxStepGoal = 8 << 10
	// maxDepResult bounds how much of each dependency's result a step's
	// goal carries, in bytes.
	maxDepResult = 16 << 10
	// planRepairs is how many times the planner is asked again for a
	// plan that is well-formed JSON but not a valid plan (a cycle, an
	// unknown tool); schema violations are repaired by models.Structured.
	planRepairs = 2
	// childCancelWait bounds how long a cancelled parent waits for its
	// sub-agents to record their own cancellation.
	childCancelWait = 10 * time.Second
)

// Defaults of Config's orchestration fields.
const (
	DefaultMaxParallelSteps = 4
	DefaultMaxReplans       = 2
)

var stepIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// checkKind validates a start request's kind and plan. It returns the
// plan a DAG run starts with (nil for other kinds).
func (e *Engine) checkKind(ctx context.Context, req StartRequest) (*keel.Plan, error) {
	switch req.Kind {
	case "", keel.KindAgent, keel.KindPlan:
		if req.Plan != nil {
			return nil, fmt.Errorf("a plan is given only with kind %q (a %q run's planner makes its own): %w", keel.KindDAG, keel.KindPlan, keel.ErrInvalid)
		}
		return nil, nil
	case keel.KindDAG:
		if req.Plan == nil {
			return nil, fmt.Errorf("a %q run needs a plan: %w", keel.KindDAG, keel.ErrInvalid)
		}
		p := clonePlan(*req.Plan)
		if err := e.checkPlan(ctx, p, req.Policy.Tools); err != nil {
			return nil, err
		}
		return &p, nil
	}
	return nil, fmt.Errorf("kind %q: want %q, %q or %q: %w", req.Kind, keel.KindAgent, keel.KindPlan, keel.KindDAG, keel.ErrInvalid)
}

// checkPlan is validatePlan over the tools of this environment and,
// with a Placer, those another environment declares for the steps that
// need them (placeable).
func (e *Engine) checkPlan(ctx context.Context, p keel.Plan, allowed []string) error {
	specs := e.cfg.Tools.Specs(ctx)
	elsewhere, err := e.placeable(ctx, p, specs)
	if err != nil {
		return err
	}
	for _, t := range elsewhere {
		specs = append(specs, keel.ToolSpec{Name: t})
	}
	return validatePlan(p, specs, allowed)
}

// validatePlan checks that p is a DAG of at most MaxPlanSteps steps with
// unique IDs, known dependencies, no cycle, tools that exist (and that the
// run may use, when allowed is not nil) and bounded sizes. Errors wrap
// keel.ErrInvalid and say what is wrong.
func validatePlan(p keel.Plan, specs []keel.ToolSpec, allowed []string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("plan: "+format+": %w", append(a, keel.ErrInvalid)...)
	}
	if len(p.Steps) == 0 {
		return bad("it has no steps")
	}
	if len(p.Steps) > MaxPlanSteps {
		return bad("it has %d steps; at most %d", len(p.Steps), MaxPlanSteps)
	}
	index := map[string]int{}
	for i, s := range p.Steps {
		switch {
		case s.ID == "":
			return bad("step %d has no id", i+1)
		case !stepIDPattern.MatchString(s.ID):
			return bad("step id %q: use 1 to 64 letters, digits, '-' or '_'", s.ID)
		}
		if _, dup := index[s.ID]; dup {
			return bad("step id %q is used twice", s.ID)
		}
		index[s.ID] = i
	}
	for _, s := range p.Steps {
		switch {
		case strings.TrimSpace(s.Goal) == "":
			return bad("step %q has an empty goal", s.ID)
		case len(s.Goal) > maxStepGoal:
			return bad("step %q: goal longer than %d bytes", s.ID, maxStepGoal)
		case s.Retries < 0 || s.Retries > MaxStepRetries:
			return bad("step %q: retries %d out of range 0..%d", s.ID, s.Retries, MaxStepRetries)
		case s.MaxSteps < 0 || s.MaxSteps > MaxStepsLimit:
			return bad("step %q: max_steps %d out of range 0..%d", s.ID, s.MaxSteps, MaxStepsLimit)
		case s.BudgetTokens < 0:
			return bad("step %q: budget_tokens cannot be negative", s.ID)
		}
		for j, d := range s.DependsOn {
			if _, ok := index[d]; !ok {
				return bad("step %q depends on unknown step %q", s.ID, d)
			}
			if d == s.ID {
				return bad("step %q depends on itself", s.ID)
			}
			if slices.Contains(s.DependsOn[:j], d) {
				return bad("step %q lists dependency %q twice", s.ID, d)
			}
		}
		for j, t := range s.Tools {
			if !slices.ContainsFunc(specs, func(sp keel.ToolSpec) bool { return sp.Name == t }) {
				return bad("step %q names unknown tool %q", s.ID, t)
			}
			if allowed != nil && !slices.Contains(allowed, t) {
				return bad("step %q names tool %q, which the run may not use", s.ID, t)
			}
			if slices.Contains(s.Tools[:j], t) {
				return bad("step %q lists tool %q twice", s.ID, t)
			}
		}
	}
	if cycle := findCycle(p, index); cycle != nil {
		return bad("the steps form a cycle: %s", strings.Join(cycle, " → "))
	}
	return nil
}

// findCycle returns the steps of a dependency cycle of p, the first
// repeated at the end, or nil.
func findCycle(p keel.Plan, index map[string]int) []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(p.Steps))
	var path []string
	var visit func(i int) []string
	visit = func(i int) []string {
		state[i] = onPath
		path = append(path, p.Steps[i].ID)
		for _, d := range p.Steps[i].DependsOn {
			j := index[d]
			switch state[j] {
			case onPath:
				start := slices.Index(path, d)
				return append(slices.Clone(path[start:]), d)
			case unseen:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = done
		return nil
	}
	for i := range p.Steps {
		if state[i] == unseen {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

func clonePlan(p keel.Plan) keel.Plan {
	out := keel.Plan{Steps: make([]keel.PlanStep, len(p.Steps))}
	for i, s := range p.Steps {
		s.Tools = slices.Clone(s.Tools)
		s.DependsOn = slices.Clone(s.DependsOn)
		out.Steps[i] = s
	}
	return out
}

// planTools is every tool some step of plan may use, sorted.
func planTools(plan keel.Plan) []string {
	out := []string{}
	for _, s := range plan.Steps {
		for _, t := range s.Tools {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	slices.Sort(out)
	return out
}

// planSchema is the JSON Schema of a keel.Plan the planner must reply
// with; a step's tools are limited to those the run may use.
func planSchema(specs []keel.ToolSpec) json.RawMessage {
	tools := map[string]any{"type": "array", "maxItems": 0}
	if len(specs) > 0 {
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.Name
		}
		tools = map[string]any{"type": "array", "uniqueItems": true, "items": map[string]any{"type": "string", "enum": names}}
	}
	step := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"id", "goal"},
		"properties": map[string]any{
			"id":            map[string]any{"type": "string", "pattern": stepIDPattern.String()},
			"goal":          map[string]any{"type": "string", "minLength": 1, "maxLength": maxStepGoal},
			"tools":         tools,
			"depends_on":    map[string]any{"type": "array", "uniqueItems": true, "items": map[string]any{"type": "string"}},
			"retries":       map[string]any{"type": "integer", "minimum": 0, "maximum": MaxStepRetries},
			"max_steps":     map[string]any{"type": "integer", "minimum": 0, "maximum": MaxStepsLimit},
			"budget_tokens": map[string]any{"type": "integer", "minimum": 0},
		},
	}
	b, _ := json.Marshal(map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"steps"},
		"properties": map[string]any{
			"steps": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxPlanSteps, "items": step},
		},
	})
	return b
}
