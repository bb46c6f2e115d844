// Package route decides where a step runs: on the edge daemon that holds
// its data or its local-only tool, or in the cloud, which offers the
// large models. The decision is a pure function of the environments'
// declarations (Env, what each one publishes of its env.describe) and of
// what the step needs (Need): no I/O, no clock. A Table indexes the
// declarations by tool so a decision among a thousand edges takes
// microseconds; it is safe for concurrent use.
package route

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kinds of environment.
const (
	KindEdge  = "edge"  // a keel daemon joined as a leaf node
	KindCloud = "cloud" // the cloud's workers
)

// LabelPrivate is the label of data that never leaves the environment
// that holds it (keel.LabelPrivate).
const LabelPrivate = "private"

// Env is one environment's declaration: what it can run and what data
// it may hold. An edge publishes its own (cloud/edge, from env.describe);
// the cloud's workers publish theirs.
type Env struct {
	// Name names the environment among all others (an edge's --name,
	// "cloud" for the workers).
	Name string `json:"name"`
	// Kind is KindEdge or KindCloud.
	Kind string `json:"kind"`
	// Tools are the tools it runs, each with the labels its grants give
	// its output.
	Tools []Tool `json:"tools,omitempty"`
	// Models are the models it can call.
	Models []Model `json:"models,omitempty"`
	// Labels are the labels of data it may hold: on an edge, the labels
	// of its grants (private among them when a grant is marked private);
	// the cloud declares only the labels its operator lets it hold, never
	// private.
	Labels []string `json:"labels,omitempty"`
	// Load is how many handed-off steps it runs now.
	Load int `json:"load,omitempty"`
	// Version is the keel version it runs.
	Version string `json:"version,omitempty"`
	// At is when it published this declaration (its heartbeat).
	At time.Time `json:"at,omitzero"`
}

// Tool is a tool an environment runs.
type Tool struct {
	Name        string `json:"name"`
	SideEffects string `json:"side_effects,omitempty"`
	// Labels are the labels its grants give what it reads (private for
	// a grant marked private).
	Labels []string `json:"labels,omitempty"`
}

// Model is a model an environment can call.
type Model struct {
	Name          string `json:"name"`
	ContextLength int    `json:"context_length,omitempty"`
}

// Need is what a step needs of the environment it runs in.
type Need struct {
	// Tools must all be declared by the environment.
	Tools []string `json:"tools,omitempty"`
	// Model, when set, must be declared by the environment (a large
	// model only the cloud offers, a local one only an edge has).
	Model string `json:"model,omitempty"`
	// MinContext, when set, is the least context length of a model the
	// environment declares (of Model when it is set).
	MinContext int `json:"min_context,omitempty"`
	// Labels are the labels of the step's inputs. The environment must
	// declare it may hold every one, but Origin, which holds them
	// already; private inputs never leave Origin.
	Labels []string `json:"labels,omitempty"`
	// Origin is the environment the step's inputs come from (the edge
	// whose run hands the step off); empty: the cloud.
	Origin string `json:"origin,omitempty"`
	// Kind, when set, is the only kind of environment (KindEdge,
	// KindCloud) the step may go to, the origin excepted: what the
	// origin can hand steps to.
	Kind string `json:"kind,omitempty"`
}

// Decision is where a step runs, and why.
type Decision struct {
	Env    string `json:"env"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// ErrNoEnvironment is wrapped by the error of a step no declared
// environment can run; the error says what was missing.
var ErrNoEnvironment = errors.New("no environment can run the step")

// Table holds the declarations the router decides over, indexed by tool.
// The zero value is not usable; make one with NewTable. Its methods are
// safe for concurrent use.
type Table struct {
	mu     sync.RWMutex
	envs   map[string]*entry
	byTool map[string]map[string]*entry
}

// entry is one declaration with sets for its checks.
type entry struct {
	env    Env
	tools  map[string]bool
	models map[string]int // name → context length
	labels map[string]bool
	maxCtx int
}

// NewTable returns a table holding envs.
func NewTable(envs ...Env) *Table {
	t := &Table{envs: map[string]*entry{}, byTool: map[string]map[string]*entry{}}
	for _, e := range envs {
		t.Put(e)
	}
	return t
}

// Put adds or replaces the declaration of env.Name.
func (t *Table) Put(env Env) {
	en := &entry{env: env, tools: map[string]bool{}, models: map[string]int{}, labels: map[string]bool{}}
	for _, tl := range env.Tools {
		en.tools[tl.Name] = true
	}
	for _, m := range env.Models {
		en.models[m.Name] = max(en.models[m.Name], m.ContextLength)
		en.maxCtx = max(en.maxCtx, m.ContextLength)
	}
	for _, l := range env.Labels {
		en.labels[l] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(env.Name)
	t.envs[env.Name] = en
	for name := range en.tools {
		m := t.byTool[name]
		if m == nil {
			m = map[string]*entry{}
			t.byTool[name] = m
		}
		m[env.Name] = en
	}
}

// Remove drops the declaration of name, if any.
func (t *Table) Remove(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(name)
}

func (t *Table) removeLocked(name string) {
	old := t.envs[name]
	if old == nil {
		return
	}
	delete(t.envs, name)
	for tool := range old.tools {
		delete(t.byTool[tool], name)
		if len(t.byTool[tool]) == 0 {
			delete(t.byTool, tool)
		}
	}
}

// Envs returns the declarations, sorted by name.
func (t *Table) Envs() []Env {
	t.mu.RLock()
	out := make([]Env, 0, len(t.envs))
	for _, e := range t.envs {
		out = append(out, e.env)
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b Env) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Len is how many environments the table holds.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.envs)
}

// Decide picks the environment a step with need runs in (Decide's rules).
func (t *Table) Decide(need Need) (Decision, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	// Candidates: the environments declaring the rarest tool needed, or
	// every one when the step needs no tool.
	cands := t.envs
	for _, name := range need.Tools {
		m := t.byTool[name]
		if len(m) < len(cands) {
			cands = m
		}
		if len(m) == 0 {
			return Decision{}, fmt.Errorf("%w: no environment declares the tool %s", ErrNoEnvironment, name)
		}
	}
	// Private inputs stay at their origin: it is the only candidate.
	if slices.Contains(need.Labels, LabelPrivate) {
		o := t.envs[need.Origin]
		if o == nil {
			return Decision{}, fmt.Errorf("%w: the inputs are private to %s, which declares nothing", ErrNoEnvironment, originName(need.Origin))
		}
		cands = map[string]*entry{need.Origin: o}
	}
	var best *entry
	var why []string
	for _, en := range cands {
		if !en.can(need) {
			if len(why) < 3 {
				why = append(why, en.env.Name+": "+en.fails(need))
			}
			continue
		}
		if best == nil || better(en, best, need.Origin) {
			best = en
		}
	}
	if best == nil {
		slices.Sort(why)
		return Decision{}, fmt.Errorf("%w: %s", ErrNoEnvironment, strings.Join(why, "; "))
	}
	return Decision{Env: best.env.Name, Kind: best.env.Kind, Reason: reason(best, need)}, nil
}

// Decide picks the environment among envs that a step with need runs in:
//
//   - it declares every tool of need.Tools, need.Model if set, and a
//     model of at least need.MinContext;
//   - it may hold every label of need.Labels, and private inputs stay in
//     need.Origin: only the origin may run a step with private inputs;
//   - among those that can, the origin first (the data stays where it
//     is), then the cloud, then the least loaded edge, then by name.
//
// It is NewTable(envs...).Decide(need); a router keeps a Table.
func Decide(need Need, envs []Env) (Decision, error) {
	return NewTable(envs...).Decide(need)
}

// can reports whether en can run a step with need (fails says why not).
func (en *entry) can(need Need) bool {
	if need.Kind != "" && en.env.Kind != need.Kind && en.env.Name != need.Origin {
		return false
	}
	for _, tl := range need.Tools {
		if !en.tools[tl] {
			return false
		}
	}
	if need.Model != "" {
		if c, ok := en.models[need.Model]; !ok || c < need.MinContext {
			return false
		}
	} else if en.maxCtx < need.MinContext {
		return false
	}
	if en.env.Name == need.Origin {
		return true // the inputs are there already
	}
	for _, l := range need.Labels {
		if !en.labels[l] || l == LabelPrivate {
			return false
		}
	}
	return true
}

// fails says why en cannot run a step with need; "" if it can.
func (en *entry) fails(need Need) string {
	if need.Kind != "" && en.env.Kind != need.Kind && en.env.Name != need.Origin {
		return "not an environment of kind " + need.Kind
	}
	for _, tl := range need.Tools {
		if !en.tools[tl] {
			return "no tool " + tl
		}
	}
	if need.Model != "" {
		c, ok := en.models[need.Model]
		if !ok {
			return "no model " + need.Model
		}
		if c < need.MinContext {
			return fmt.Sprintf("model %s holds %d tokens, want %d", need.Model, c, need.MinContext)
		}
	} else if need.MinContext > 0 && en.maxCtx < need.MinContext {
		return fmt.Sprintf("no model of %d tokens", need.MinContext)
	}
	for _, l := range need.Labels {
		if en.env.Name == need.Origin {
			break
		}
		if l == LabelPrivate {
			return "the inputs are private to " + originName(need.Origin)
		}
		if !en.labels[l] {
			return "may not hold " + l
		}
	}
	return ""
}

func originName(o string) string {
	if o == "" {
		return "the cloud"
	}
	return o
}

// better reports whether a is preferred to b for a step from origin.
func better(a, b *entry, origin string) bool {
	if (a.env.Name == origin) != (b.env.Name == origin) {
		return a.env.Name == origin
	}
	if (a.env.Kind == KindCloud) != (b.env.Kind == KindCloud) {
		return a.env.Kind == KindCloud
	}
	if a.env.Load != b.env.Load {
		return a.env.Load < b.env.Load
	}
	return a.env.Name < b.env.Name
}

func reason(en *entry, need Need) string {
	switch {
	case slices.Contains(need.Labels, LabelPrivate):
		return "the inputs are private: the step stays where they are"
	case en.env.Name == need.Origin:
		return "the origin can run it: the inputs stay where they are"
	case en.env.Kind == KindCloud && need.Model != "":
		return "the cloud declares the model " + need.Model
	case en.env.Kind == KindCloud:
		return "the cloud can run it"
	case len(need.Tools) > 0:
		return "it declares the tools " + strings.Join(need.Tools, ", ")
	default:
		return "the least loaded environment that can run it"
	}
}
