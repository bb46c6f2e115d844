package policy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
)

// Rule is one rule of a layer file. Its exported fields say where it
// is; the conditions are private and fixed once compiled. A *Rule is
// shared by its policy and every decision it makes: read it, never
// modify it. A rule
// matches an action when every condition it has holds; a condition with
// a list holds when one of the list does.
type Rule struct {
	Layer Layer
	File  string
	Line  int
	Col   int
	N     int // the rule's position in its file's rules, from 1
	Kind  Kind
	// Outcome is the rule's decision.
	Outcome Outcome
	// Reason is the rule's own explanation, if it gives one.
	Reason string

	text        string // as written
	expl        string // the explanation of a decision it makes (Decision.String), formatted once at Compile
	seq         int    // position in the whole policy, for ties
	never       bool   // warned: can never match
	tool        string // glob; "" is any
	sideEffects []keel.SideEffect
	paths       []PathGlob
	hasPaths    bool
	urls        []URLPattern
	hasURLs     bool
	args        []argCond
	labels      []Label
	hasLabels   bool
	provider    string // glob
	model       string // glob
	where       where
	scope       string // glob
}

type where uint8

const (
	whereAny where = iota
	whereLocal
	whereCloud
)

type argCond struct {
	ptr  pointer
	glob string
}

// String names the rule and where it is: "rule 3 of the managed layer
// (/etc/keel/policy.json:12:5)".
func (r *Rule) String() string {
	return fmt.Sprintf("rule %d of the %s layer (%s:%d:%d)", r.N, r.Layer, r.File, r.Line, r.Col)
}

// Text is the rule as written in its file.
func (r *Rule) Text() string { return r.text }

// restricts reports whether the rule asks or denies: such a rule
// matches an argument that cannot be normalized.
func (r *Rule) restricts() bool { return r.Outcome > Allow }

// isGlob reports whether s holds a wildcard.
func isGlob(s string) bool { return strings.ContainsAny(s, "*?") }

// Options configure how a policy reads patterns and paths. The zero
// value has no home directory (a pattern or path starting with ~ is an
// error) and matches paths case-sensitively.
type Options struct {
	// Home is what ~ stands for, in patterns and in paths.
	Home string
	// FoldCase matches paths case-insensitively, for a case-insensitive
	// file system (the default on macOS and Windows).
	FoldCase bool
}

// bucket indexes the rules of one action kind by the name they apply to.
type bucket struct {
	exact map[string][]*Rule // rules naming one tool, provider or scope
	any   []*Rule            // rules with a wildcard or no name
}

// Policy is the effective policy of a set of layer files: an immutable
// value, safe for concurrent use.
type Policy struct {
	opts     Options
	files    []LayerFile
	rules    []*Rule
	index    [numKinds + 1]bucket
	cloudOff *Setting // non-nil: no cloud model calls
	clear    map[Label]*clearSetting
	egress   outcomeSetting
	defaults [numLayers][numKinds + 1]outcomeSetting
	sources  []labelSource
	locks    map[string]*Setting
	warnings []Warning
	digest   string
	targets  targetRules // which tool calls a path or url rule may look at
}

// Compile builds the effective policy of the given files. A file may be
// empty of rules but must be a JSON object. Every problem is reported:
// the error joins one *FileError per problem (errors.As finds the
// first). Warnings (rules that can never match, loosening that has no
// effect) do not fail it; Warnings lists them.
func Compile(opts Options, files ...LayerFile) (*Policy, error) {
	docs := make([]*doc, 0, len(files))
	for _, f := range files {
		if f.Layer >= numLayers {
			return nil, fmt.Errorf("policy: %s: no layer %d", f.Name, f.Layer)
		}
		docs = append(docs, parseFile(f, opts))
	}
	slices.SortStableFunc(docs, func(a, b *doc) int { return int(a.Layer) - int(b.Layer) })
	p := &Policy{opts: opts, locks: map[string]*Setting{}, clear: map[Label]*clearSetting{}, egress: outcomeSetting{v: Ask}}
	for _, d := range docs {
		p.files = append(p.files, d.LayerFile)
	}
	// Locks come from the managed layer; check every lower setting.
	var managed []*doc
	for _, d := range docs {
		if d.Layer == LayerManaged {
			managed = append(managed, d)
			for _, l := range d.locks {
				p.locks[l.key] = l.at
			}
		}
	}
	for _, d := range docs {
		if d.Layer != LayerManaged {
			checkLocks(d, managed, p.locks)
		}
	}
	if err := join(docs); err != nil {
		return nil, err
	}
	for _, d := range docs {
		p.merge(d)
		p.warnings = append(p.warnings, d.warnings...)
	}
	p.digest = digest(p.files)
	p.targets = indexTargets(&p.index[KindTool])
	for _, r := range p.rules {
		// Every decision a rule makes is explained the same way; format
		// it once rather than on each decision journaled or shown.
		r.expl = r.Outcome.String() + ": " + r.String()
		if r.Reason != "" {
			r.expl += ": " + r.Reason
		}
	}
	return p, nil
}

// checkLocks refuses a lower layer's value for a locked setting that
// differs from the managed layer's.
func checkLocks(d *doc, managed []*doc, locks map[string]*Setting) {
	if len(locks) == 0 {
		return
	}
	locked := func(key string) *Setting {
		if at := locks[key]; at != nil {
			return at
		}
		if i := strings.IndexByte(key, '.'); i >= 0 {
			return locks[key[:i]]
		}
		return nil
	}
	refuse := func(s *Setting, by *Setting, what string) {
		d.errs = append(d.errs, &FileError{File: d.Name, Line: s.Line, Col: s.Col, Field: s.Key, Err: ErrLocked,
			Msg: fmt.Sprintf("%s, but %s locked it at %s:%d:%d", what, s.Key, by.File, by.Line, by.Col)})
	}
	if d.cloud != nil {
		if by := locked("cloud"); by != nil {
			var m *boolSetting
			for _, md := range managed {
				if md.cloud != nil {
					m = md.cloud
				}
			}
			if m == nil || m.v != d.cloud.v {
				refuse(d.cloud.at, by, fmt.Sprintf("this file sets it to %v", d.cloud.v))
			}
		}
	}
	if d.egress != nil {
		if by := locked("egress_after_labels"); by != nil {
			var m *outcomeSetting
			for _, md := range managed {
				if md.egress != nil {
					m = md.egress
				}
			}
			if m == nil || m.v != d.egress.v {
				refuse(d.egress.at, by, fmt.Sprintf("this file sets it to %s", d.egress.v))
			}
		}
	}
	for k, s := range d.defaults {
		if s == nil {
			continue
		}
		if by := locked("default." + Kind(k).String()); by != nil {
			var m *outcomeSetting
			for _, md := range managed {
				if md.defaults[k] != nil {
					m = md.defaults[k]
				}
			}
			if m == nil || m.v != s.v {
				refuse(s.at, by, fmt.Sprintf("this file sets it to %s", s.v))
			}
		}
	}
	for l, s := range d.clear {
		if by := locked("clear." + string(l)); by != nil {
			var m *clearSetting
			for _, md := range managed {
				if c := md.clear[l]; c != nil {
					m = c
				}
			}
			if m == nil || !slices.Equal(m.providers, s.providers) {
				refuse(s.at, by, fmt.Sprintf("this file clears %s for %v", l, s.providers))
			}
		}
	}
}

// merge adds one file's rules and settings, files coming in precedence
// order: a setting takes the strictest value of the layers that set it,
// and a lower layer's looser value is a warning.
func (p *Policy) merge(d *doc) {
	warn := func(s *Setting, format string, args ...any) {
		p.warnings = append(p.warnings, Warning{File: s.File, Line: s.Line, Col: s.Col, Msg: fmt.Sprintf(format, args...)})
	}
	if c := d.cloud; c != nil {
		switch {
		case !c.v && p.cloudOff == nil:
			p.cloudOff = c.at
		case c.v && p.cloudOff != nil && p.cloudOff.Layer < d.Layer:
			warn(c.at, "cloud: true has no effect: %s", p.cloudOff)
		}
	}
	if e := d.egress; e != nil {
		switch {
		case p.egress.at == nil || e.v > p.egress.v:
			p.egress = *e
		case e.v < p.egress.v:
			warn(e.at, "egress_after_labels: %s has no effect: it cannot loosen %s (%s)", e.v, p.egress.v, p.egress.at)
		}
	}
	for k, s := range d.defaults {
		// Two files of one layer (a run's rules and --require-approval):
		// the stricter default.
		if cur := p.defaults[d.Layer][k]; s != nil && (cur.at == nil || s.v > cur.v) {
			p.defaults[d.Layer][k] = *s
		}
	}
	for l, c := range d.clear {
		cur := p.clear[l]
		if cur == nil {
			p.clear[l] = c
			continue
		}
		var kept, dropped []string
		for _, prov := range c.providers {
			if slices.Contains(cur.providers, prov) || slices.Contains(cur.providers, "*") {
				kept = append(kept, prov)
			} else {
				dropped = append(dropped, prov)
			}
		}
		if len(dropped) > 0 {
			warn(c.at, "clear.%s: %v has no effect: %s", l, dropped, cur.at)
		}
		p.clear[l] = &clearSetting{providers: kept, at: c.at}
	}
	p.sources = append(p.sources, d.sources...)
	for _, r := range d.rules {
		r.seq = len(p.rules)
		p.rules = append(p.rules, r)
		if r.never {
			continue
		}
		b := &p.index[r.Kind]
		key := r.indexKey()
		if key == "" {
			b.any = append(b.any, r)
			continue
		}
		if b.exact == nil {
			b.exact = map[string][]*Rule{}
		}
		b.exact[key] = append(b.exact[key], r)
	}
}

// indexKey is the name a rule applies to when it names exactly one, or
// "".
func (r *Rule) indexKey() string {
	var k string
	switch r.Kind {
	case KindTool, KindEgress:
		k = r.tool
	case KindModel:
		k = r.provider
	case KindKnowledge:
		k = r.scope
	}
	if isGlob(k) {
		return ""
	}
	return k
}

// actionKey is the name an action is indexed by.
func (a *Action) key() string {
	switch a.Kind {
	case KindTool, KindEgress:
		return a.Tool
	case KindModel:
		return a.Provider
	case KindKnowledge:
		return a.Scope
	}
	return ""
}

func digest(files []LayerFile) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range files {
		h.Write([]byte{byte(f.Layer)})
		binary.BigEndian.PutUint64(n[:], uint64(len(f.Name)))
		h.Write(n[:])
		h.Write([]byte(f.Name))
		binary.BigEndian.PutUint64(n[:], uint64(len(f.Data)))
		h.Write(n[:])
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Digest identifies the policy's exact inputs (every file's layer, name
// and bytes): a hex SHA-256. Journal it with a decision to know which
// policy was in force.
func (p *Policy) Digest() string { return p.digest }

// Warnings lists the problems that did not stop the policy from
// loading, in precedence order, in a new slice.
func (p *Policy) Warnings() []Warning { return slices.Clone(p.warnings) }

// Rules lists every rule, in precedence order, in a new slice.
func (p *Policy) Rules() []*Rule { return slices.Clone(p.rules) }

// Files lists the files the policy was compiled from, in precedence
// order, in a new slice.
func (p *Policy) Files() []LayerFile { return slices.Clone(p.files) }

// WithRun returns the policy with run-layer files added (a run's own
// rules, RequireApproval's): the policy a run's decisions use. p is
// unchanged. Every file must be of LayerRun.
func (p *Policy) WithRun(files ...LayerFile) (*Policy, error) {
	for _, f := range files {
		if f.Layer != LayerRun {
			return nil, fmt.Errorf("policy: %s is of the %s layer, not run", f.Name, f.Layer)
		}
	}
	return Compile(p.opts, append(slices.Clone(p.files), files...)...)
}

// Cleared reports whether data labelled l may go to the cloud provider:
// only if a layer cleared it for that provider (or for "*") and no
// higher layer cleared it for fewer. Private is never cleared: it is
// data that never leaves the machine (the model layer refuses it too).
// Local providers need no clearance.
func (p *Policy) Cleared(l Label, provider string) bool {
	if l == Private {
		return false
	}
	c := p.clear[l]
	return c != nil && (slices.Contains(c.providers, provider) || slices.Contains(c.providers, "*"))
}

// LabelsOf returns the labels the policy gives the data of src, joined
// over every layer's sources. A path is normalized first (~, .., NFC,
// case if folding); one that cannot be is given every label any path
// source gives.
func (p *Policy) LabelsOf(src Source) LabelSet {
	var out LabelSet
	var norm string
	var normErr error
	if src.Kind == SourcePath {
		norm, normErr = NormalizePath(src.Name, PathOptions{Home: p.opts.Home, FoldCase: p.opts.FoldCase})
	}
	for _, s := range p.sources {
		if s.kind != src.Kind {
			continue
		}
		switch s.kind {
		case SourcePath:
			if normErr != nil || s.path.Match(norm) {
				out = out.Union(s.labels)
			}
		case SourceScope:
			if wildcard(s.name, src.Name, '/') {
				out = out.Union(s.labels)
			}
		case SourceTool:
			if wildcard(s.name, src.Name, 0) {
				out = out.Union(s.labels)
			}
		default:
			out = out.Union(s.labels)
		}
	}
	return out
}

// Decide decides an action. It reads a and what it points to and keeps
// nothing; it does not allocate when the action names no path or URL
// that needs rewriting to be matched. An action of an unknown kind is
// denied.
//
// The verdict is the strictest of: each layer's verdict (its strictest
// matching rule, else its default for the kind if it sets one), and for
// a cloud model call the cloud and clear settings, for egress with
// labelled data in the context egress_after_labels. Ties are explained
// by the highest layer, then the earliest rule. When nothing has a
// verdict, the action is allowed, but for a knowledge read of a scope
// that is not the reader's own (Action.Own), which is denied.
func (p *Policy) Decide(a *Action) Decision {
	k := a.Kind
	if k == 0 || k > numKinds {
		return Decision{Outcome: Deny, kind: k}
	}
	var floor Decision
	switch k {
	case KindModel:
		if a.Cloud {
			if p.cloudOff != nil {
				return Decision{Outcome: Deny, cause: causeCloudOff, setting: p.cloudOff, kind: k}
			}
			for _, l := range a.Labels.s {
				if !p.Cleared(l, a.Provider) {
					d := Decision{Outcome: Deny, cause: causeNotCleared, label: l, subject: a.Provider, kind: k}
					if c := p.clear[l]; c != nil {
						d.setting = c.at
					}
					return d
				}
			}
		}
	case KindEgress:
		if a.Labels.Len() > 0 {
			floor = Decision{Outcome: p.egress.v, cause: causeEgressLabels, setting: p.egress.at, kind: k}
		}
	}
	var best [numLayers]*Rule
	var m matchState
	b := &p.index[k]
	consider := func(r *Rule) {
		cur := best[r.Layer]
		if cur != nil && (cur.Outcome > r.Outcome || cur.Outcome == r.Outcome && cur.seq < r.seq) {
			return
		}
		if r.match(a, &m, &p.opts) {
			best[r.Layer] = r
		}
	}
	if b.exact != nil {
		for _, r := range b.exact[a.key()] {
			consider(r)
		}
	}
	for _, r := range b.any {
		consider(r)
	}
	d := Decision{kind: k}
	for l := range Layer(numLayers) {
		var c Decision
		if r := best[l]; r != nil {
			c = Decision{Outcome: r.Outcome, cause: causeRule, rule: r, kind: k}
		} else if def := p.defaults[l][k]; def.at != nil {
			c = Decision{Outcome: def.v, cause: causeLayerDefault, setting: def.at, kind: k}
		}
		if c.Outcome > d.Outcome {
			d = c
		}
	}
	if floor.Outcome > d.Outcome {
		d = floor
	}
	if d.Outcome == 0 {
		d.Outcome = Allow
		if k == KindKnowledge && !a.Own {
			// Knowledge is read only where a rule says so, but for the
			// reader's own scopes.
			d.Outcome, d.cause = Deny, causeNotOwnScope
		}
	}
	return d
}

// maxArgs bounds the paths and URLs of an action normalized once per
// decision; beyond it they are normalized once per rule that looks.
const maxArgs = 8

// matchState holds an action's paths and URLs normalized, once, on the
// first rule that looks at them.
type matchState struct {
	pathsDone, urlsDone bool
	paths               [maxArgs]string
	pathOK              [maxArgs]bool
	urls                [maxArgs]URL
	urlOK               [maxArgs]bool
}

func (m *matchState) path(a *Action, o *Options, i int) (string, bool) {
	if i >= maxArgs {
		n, err := NormalizePath(a.Paths[i], PathOptions{Home: o.Home, Base: a.Base, FoldCase: o.FoldCase, Resolve: a.Resolve})
		return n, err == nil
	}
	if !m.pathsDone {
		m.pathsDone = true
		for j := 0; j < len(a.Paths) && j < maxArgs; j++ {
			n, err := NormalizePath(a.Paths[j], PathOptions{Home: o.Home, Base: a.Base, FoldCase: o.FoldCase, Resolve: a.Resolve})
			m.paths[j], m.pathOK[j] = n, err == nil
		}
	}
	return m.paths[i], m.pathOK[i]
}

// urlArgs returns the URLs an action names: a tool call's arguments, or
// the destination of an egress or export.
func (a *Action) urlArg(i int) (string, int) {
	if a.Kind == KindTool {
		if i < len(a.URLs) {
			return a.URLs[i], len(a.URLs)
		}
		return "", len(a.URLs)
	}
	if a.Destination == "" {
		return "", 0
	}
	return a.Destination, 1
}

func (m *matchState) url(a *Action, i int) (URL, bool) {
	raw, _ := a.urlArg(i)
	if i >= maxArgs {
		u, err := ParseURL(raw)
		return u, err == nil
	}
	if !m.urlsDone {
		m.urlsDone = true
		_, n := a.urlArg(0)
		for j := 0; j < n && j < maxArgs; j++ {
			r, _ := a.urlArg(j)
			u, err := ParseURL(r)
			m.urls[j], m.urlOK[j] = u, err == nil
		}
	}
	return m.urls[i], m.urlOK[i]
}

// match reports whether every condition of r holds for a. An argument
// that cannot be normalized (a path, a URL, malformed JSON) satisfies
// the condition of a restricting rule and not that of an allowing one.
func (r *Rule) match(a *Action, m *matchState, o *Options) bool {
	if r.tool != "" && !wildcard(r.tool, a.Tool, 0) {
		return false
	}
	if len(r.sideEffects) > 0 && !slices.Contains(r.sideEffects, a.SideEffect) {
		return false
	}
	if r.hasLabels {
		any := false
		for _, l := range r.labels {
			if a.Labels.Has(l) {
				any = true
				break
			}
		}
		if !any {
			return false
		}
	}
	switch r.where {
	case whereLocal:
		if a.Cloud {
			return false
		}
	case whereCloud:
		if !a.Cloud {
			return false
		}
	}
	if r.provider != "" && !wildcard(r.provider, a.Provider, 0) {
		return false
	}
	if r.model != "" && !wildcard(r.model, a.Model, 0) {
		return false
	}
	if r.scope != "" && !wildcard(r.scope, a.Scope, '/') {
		return false
	}
	if r.hasPaths {
		ok := a.Kind == KindTool && a.Unresolvable && r.restricts()
		if a.Kind == KindTool && a.Unresolvable && !ok {
			return false
		}
		for i := 0; i < len(a.Paths) && !ok; i++ {
			n, good := m.path(a, o, i)
			if !good {
				if r.restricts() {
					ok = true
					break
				}
				continue
			}
			for _, g := range r.paths {
				if g.Match(n) {
					ok = true
					break
				}
			}
			if ok {
				break
			}
		}
		if !ok {
			return false
		}
	}
	if r.hasURLs {
		ok := a.Kind == KindTool && a.Unresolvable && r.restricts()
		if a.Kind == KindTool && a.Unresolvable && !ok {
			return false
		}
		_, n := a.urlArg(0)
		for i := 0; i < n && !ok; i++ {
			u, good := m.url(a, i)
			if !good {
				ok = r.restricts()
				continue
			}
			for _, p := range r.urls {
				if p.Match(u) {
					ok = true
					break
				}
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.args) > 0 {
		args := []byte(a.Args)
		if len(args) == 0 {
			args = emptyObject
		}
		for _, c := range r.args {
			text, found, err := c.ptr.lookup(args)
			if err != nil {
				if r.restricts() {
					continue
				}
				return false
			}
			if !found || !wildcard(c.glob, text, 0) {
				return false
			}
		}
	}
	return true
}

var emptyObject = []byte("{}")
