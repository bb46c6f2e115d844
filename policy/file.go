package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
)

// LayerFile is one policy file's contents and where they come from.
// Name is what errors and explanations call it: a path, or a name such
// as "run.start" or "--require-approval".
type LayerFile struct {
	Layer Layer
	Name  string
	Data  []byte
}

// doc is one decoded layer file.
type doc struct {
	LayerFile
	cloud    *boolSetting
	egress   *outcomeSetting
	defaults [numKinds + 1]*outcomeSetting
	clear    map[Label]*clearSetting
	locks    []lock
	rules    []*Rule
	sources  []labelSource
	warnings []Warning
	errs     []error
}

type boolSetting struct {
	v  bool
	at *Setting
}

type outcomeSetting struct {
	v  Outcome
	at *Setting
}

type clearSetting struct {
	providers []string // sorted
	at        *Setting
}

type lock struct {
	key string
	at  *Setting
}

// labelSource gives labels to the data of a source.
type labelSource struct {
	kind   SourceKind
	name   string   // exact tool name, or a glob for scopes
	path   PathGlob // SourcePath
	labels LabelSet
	at     *Setting
}

// decoder decodes one file's tree into a doc, collecting every error.
type decoder struct {
	d    *doc
	opts Options
}

func (dc *decoder) errAt(off int, field string, kind error, format string, args ...any) {
	line, col := position(dc.d.Data, off)
	dc.d.errs = append(dc.d.errs, &FileError{File: dc.d.Name, Line: line, Col: col, Field: field, Err: kind, Msg: fmt.Sprintf(format, args...)})
}

func (dc *decoder) warnAt(off int, format string, args ...any) {
	line, col := position(dc.d.Data, off)
	dc.d.warnings = append(dc.d.warnings, Warning{File: dc.d.Name, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

func (dc *decoder) setting(key string, off int) *Setting {
	line, col := position(dc.d.Data, off)
	return &Setting{Key: key, Layer: dc.d.Layer, File: dc.d.Name, Line: line, Col: col}
}

// parseFile decodes one layer file. The returned doc's errs hold every
// problem found.
func parseFile(f LayerFile, opts Options) *doc {
	d := &doc{LayerFile: f}
	if len(f.Data) > MaxFileSize {
		d.errs = append(d.errs, &FileError{File: f.Name, Line: 1, Col: 1, Err: ErrTooLarge, Msg: fmt.Sprintf("%d bytes, at most %d", len(f.Data), MaxFileSize)})
		return d
	}
	root, err := parseTree(f.Name, f.Data)
	if err != nil {
		d.errs = append(d.errs, err)
		return d
	}
	dc := &decoder{d: d, opts: opts}
	if root.kind != '{' {
		dc.errAt(root.start, "", ErrInvalid, "a policy file is a JSON object, not %s", root.kindName())
		return d
	}
	for _, m := range root.keys {
		dc.top(m)
	}
	return d
}

// MaxFileSize is the largest policy file read, 1 MiB.
const MaxFileSize = 1 << 20

func (dc *decoder) top(m member) {
	v := m.val
	switch m.name {
	case "comment":
		dc.str(m, m.name)
	case "version":
		if v.kind != 'n' || v.str != "1" {
			dc.errAt(v.start, "version", ErrInvalid, "the only version is 1")
		}
	case "cloud":
		if v.kind != 'b' {
			dc.errAt(v.start, "cloud", ErrInvalid, "want true or false, not %s", v.kindName())
			return
		}
		dc.d.cloud = &boolSetting{v: v.b, at: dc.setting("cloud", m.start)}
	case "egress_after_labels":
		if o, ok := dc.outcome(m, "egress_after_labels"); ok {
			dc.d.egress = &outcomeSetting{v: o, at: dc.setting("egress_after_labels", m.start)}
		}
	case "default":
		if !dc.object(v, "default") {
			return
		}
		for _, km := range v.keys {
			k, ok := parseKind(km.name)
			if !ok {
				dc.errAt(km.start, "default."+km.name, ErrUnknownField, "want one of tool, model, egress, knowledge, telemetry")
				continue
			}
			if o, ok := dc.outcome(km, "default."+km.name); ok {
				dc.d.defaults[k] = &outcomeSetting{v: o, at: dc.setting("default."+km.name, km.start)}
			}
		}
	case "clear":
		if !dc.object(v, "clear") {
			return
		}
		dc.d.clear = map[Label]*clearSetting{}
		for _, lm := range v.keys {
			l, err := ParseLabel(lm.name)
			if err != nil {
				dc.errAt(lm.start, "clear."+lm.name, ErrInvalid, "%v", err)
				continue
			}
			ps, ok := dc.strings(lm.val, "clear."+lm.name, false)
			if !ok {
				continue
			}
			if l == Private {
				dc.warnAt(lm.start, "clear.private has no effect: data labelled private never goes to a cloud provider; give data that may go a label of its own and clear that")
				continue
			}
			slices.Sort(ps)
			dc.d.clear[l] = &clearSetting{providers: slices.Compact(ps), at: dc.setting("clear."+lm.name, lm.start)}
		}
	case "lock":
		locks, ok := dc.strings(v, "lock", false)
		if !ok {
			return
		}
		for i, k := range locks {
			at := dc.setting(k, v.elems[i].start)
			if !lockable(k) {
				dc.errAt(v.elems[i].start, "lock", ErrInvalid, "%q cannot be locked: want cloud, egress_after_labels, default, default.KIND, clear or clear.LABEL", k)
				continue
			}
			if dc.d.Layer != LayerManaged {
				dc.errAt(v.elems[i].start, "lock", ErrInvalid, "only the managed layer can lock a setting; this is the %s layer", dc.d.Layer)
				continue
			}
			dc.d.locks = append(dc.d.locks, lock{key: k, at: at})
		}
	case "sources":
		if v.kind != '[' {
			dc.errAt(v.start, "sources", ErrInvalid, "want an array, not %s", v.kindName())
			return
		}
		for i, e := range v.elems {
			dc.source(i, e)
		}
	case "rules":
		if v.kind != '[' {
			dc.errAt(v.start, "rules", ErrInvalid, "want an array, not %s", v.kindName())
			return
		}
		for i, e := range v.elems {
			if r := dc.rule(i, e); r != nil {
				dc.d.rules = append(dc.d.rules, r)
			}
		}
	default:
		dc.errAt(m.start, m.name, ErrUnknownField, "want one of version, comment, cloud, egress_after_labels, default, clear, sources, lock, rules")
	}
}

func lockable(k string) bool {
	switch k {
	case "cloud", "egress_after_labels", "default", "clear":
		return true
	}
	if rest, ok := strings.CutPrefix(k, "default."); ok {
		_, ok := parseKind(rest)
		return ok
	}
	if rest, ok := strings.CutPrefix(k, "clear."); ok {
		_, err := ParseLabel(rest)
		return err == nil
	}
	return false
}

func (dc *decoder) object(v *node, field string) bool {
	if v.kind != '{' {
		dc.errAt(v.start, field, ErrInvalid, "want an object, not %s", v.kindName())
		return false
	}
	return true
}

func (dc *decoder) str(m member, field string) (string, bool) {
	if m.val.kind != 's' {
		dc.errAt(m.val.start, field, ErrInvalid, "want a string, not %s", m.val.kindName())
		return "", false
	}
	return m.val.str, true
}

func (dc *decoder) outcome(m member, field string) (Outcome, bool) {
	s, ok := dc.str(m, field)
	if !ok {
		return 0, false
	}
	o, ok := parseOutcome(s)
	if !ok {
		dc.errAt(m.val.start, field, ErrInvalid, "%q: want allow, ask or deny", s)
	}
	return o, ok
}

// strings reads an array of strings, or a single string if one is true.
func (dc *decoder) strings(v *node, field string, one bool) ([]string, bool) {
	if one && v.kind == 's' {
		return []string{v.str}, true
	}
	if v.kind != '[' {
		want := "an array of strings"
		if one {
			want = "a string or an array of strings"
		}
		dc.errAt(v.start, field, ErrInvalid, "want %s, not %s", want, v.kindName())
		return nil, false
	}
	out := make([]string, 0, len(v.elems))
	for _, e := range v.elems {
		if e.kind != 's' {
			dc.errAt(e.start, field, ErrInvalid, "want a string, not %s", e.kindName())
			return nil, false
		}
		out = append(out, e.str)
	}
	return out, true
}

func (dc *decoder) labels(v *node, field string) ([]Label, bool) {
	ss, ok := dc.strings(v, field, false)
	if !ok {
		return nil, false
	}
	ls := make([]Label, 0, len(ss))
	for i, s := range ss {
		l, err := ParseLabel(s)
		if err != nil {
			dc.errAt(v.elems[i].start, field, ErrInvalid, "%v", err)
			return nil, false
		}
		ls = append(ls, l)
	}
	return ls, true
}

func (dc *decoder) source(i int, n *node) {
	field := fmt.Sprintf("sources[%d]", i)
	if !dc.object(n, field) {
		return
	}
	s := labelSource{at: dc.setting(field, n.start)}
	var what []string
	ok := true
	for _, m := range n.keys {
		f := field + "." + m.name
		switch m.name {
		case "comment":
			dc.str(m, f)
		case "labels":
			ls, good := dc.labels(m.val, f)
			if !good {
				ok = false
				continue
			}
			s.labels = Labels(ls...)
		case "path":
			what = append(what, m.name)
			p, good := dc.str(m, f)
			if !good {
				ok = false
				continue
			}
			g, err := CompilePathGlob(p, PathOptions{Home: dc.opts.Home, FoldCase: dc.opts.FoldCase})
			if err != nil {
				dc.errAt(m.val.start, f, ErrInvalid, "%v", err)
				ok = false
				continue
			}
			s.kind, s.path = SourcePath, g
		case "scope", "tool":
			what = append(what, m.name)
			v, good := dc.str(m, f)
			if !good {
				ok = false
				continue
			}
			s.kind, s.name = SourceKind(m.name), v
		case "source":
			what = append(what, m.name)
			v, good := dc.str(m, f)
			if !good {
				ok = false
				continue
			}
			if v != string(SourceHuman) && v != string(SourceInput) {
				dc.errAt(m.val.start, f, ErrInvalid, "%q: want human or input", v)
				ok = false
				continue
			}
			s.kind = SourceKind(v)
		default:
			dc.errAt(m.start, f, ErrUnknownField, "want one of path, scope, tool, source, labels, comment")
			ok = false
		}
	}
	if len(what) != 1 {
		dc.errAt(n.start, field, ErrInvalid, "name exactly one of path, scope, tool or source (have %d)", len(what))
		return
	}
	if s.labels.Len() == 0 {
		dc.errAt(n.start, field, ErrInvalid, "give the labels its data carries")
		return
	}
	if ok {
		dc.d.sources = append(dc.d.sources, s)
	}
}

// ruleFields lists the fields of a rule and the actions each applies to
// (nil: every action).
var ruleFields = map[string][]Kind{
	"action": nil, "decision": nil, "reason": nil, "comment": nil,
	"tool":         {KindTool, KindEgress},
	"side_effects": {KindTool},
	"path":         {KindTool},
	"url":          {KindTool, KindEgress, KindTelemetry},
	"host":         {KindTool, KindEgress, KindTelemetry},
	"args":         {KindTool},
	"labels":       {KindTool, KindModel, KindEgress},
	"provider":     {KindModel},
	"model":        {KindModel},
	"where":        {KindModel},
	"scope":        {KindKnowledge},
}

func (dc *decoder) rule(i int, n *node) *Rule {
	field := fmt.Sprintf("rules[%d]", i)
	if !dc.object(n, field) {
		return nil
	}
	line, col := position(dc.d.Data, n.start)
	r := &Rule{Layer: dc.d.Layer, File: dc.d.Name, Line: line, Col: col, N: i + 1, text: string(dc.d.Data[n.start:n.end])}
	nerr := len(dc.d.errs)
	am, ok := n.field("action")
	if !ok {
		dc.errAt(n.start, field+".action", ErrInvalid, "a rule needs an action: tool, model, egress, knowledge or telemetry")
		return nil
	}
	if s, ok := dc.str(am, field+".action"); ok {
		if r.Kind, ok = parseKind(s); !ok {
			dc.errAt(am.val.start, field+".action", ErrInvalid, "%q: want tool, model, egress, knowledge or telemetry", s)
			return nil
		}
	} else {
		return nil
	}
	if _, ok := n.field("decision"); !ok {
		dc.errAt(n.start, field+".decision", ErrInvalid, "a rule needs a decision: allow, ask or deny")
	}
	never := func(m member, why string) {
		dc.warnAt(m.start, "%s can never match: %s", field, why)
		r.never = true
	}
	for _, m := range n.keys {
		f := field + "." + m.name
		kinds, known := ruleFields[m.name]
		if !known {
			dc.errAt(m.start, f, ErrUnknownField, "a rule has no field %q", m.name)
			continue
		}
		if kinds != nil && !slices.Contains(kinds, r.Kind) {
			dc.errAt(m.start, f, ErrUnknownField, "%q does not apply to a %s rule", m.name, r.Kind)
			continue
		}
		switch m.name {
		case "action":
		case "decision":
			r.Outcome, _ = dc.outcome(m, f)
		case "reason":
			r.Reason, _ = dc.str(m, f)
		case "comment":
			dc.str(m, f)
		case "tool", "provider", "model", "scope":
			s, ok := dc.str(m, f)
			if !ok {
				continue
			}
			if s == "" {
				never(m, "an empty name")
			}
			switch m.name {
			case "tool":
				r.tool = s
				if strings.ContainsAny(s, " /\\\"") {
					never(m, fmt.Sprintf("no tool is named %q", s))
				}
			case "provider":
				r.provider = s
			case "model":
				r.model = s
			case "scope":
				r.scope = s
			}
		case "side_effects":
			ss, ok := dc.strings(m.val, f, true)
			if !ok {
				continue
			}
			for _, s := range ss {
				switch se := keel.SideEffect(s); se {
				case keel.SideEffectReadOnly, keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite, keel.SideEffectExternal:
					r.sideEffects = append(r.sideEffects, se)
				default:
					dc.warnAt(m.val.start, "%s: no tool has side effect %q (read_only, idempotent_write, non_idempotent_write, external)", f, s)
				}
			}
			if len(r.sideEffects) == 0 {
				never(m, "no known side-effect class")
			}
		case "path":
			ss, ok := dc.strings(m.val, f, true)
			if !ok {
				continue
			}
			for _, s := range ss {
				g, err := CompilePathGlob(s, PathOptions{Home: dc.opts.Home, FoldCase: dc.opts.FoldCase})
				if err != nil {
					if s != "" && s[0] != '/' && s[0] != '~' {
						dc.warnAt(m.val.start, "%s: %q is relative, and paths are matched absolute: it can never match", f, s)
						continue
					}
					dc.errAt(m.val.start, f, ErrInvalid, "%v", err)
					continue
				}
				r.paths = append(r.paths, g)
			}
			r.hasPaths = true
			if len(r.paths) == 0 && len(dc.d.errs) == nerr {
				never(m, "no path it could match")
			}
		case "url", "host":
			ss, ok := dc.strings(m.val, f, true)
			if !ok {
				continue
			}
			for _, s := range ss {
				pat := s
				if m.name == "host" {
					if strings.ContainsAny(s, "/@?#") {
						dc.errAt(m.val.start, f, ErrInvalid, "%q: a host is a name or address, without scheme, port or path (use url for those)", s)
						continue
					}
					if strings.Contains(s, ":") && !strings.HasPrefix(s, "[") {
						s = "[" + s + "]"
					}
					pat = "*://" + s + ":*"
				}
				p, err := CompileURLPattern(pat)
				if err != nil {
					dc.errAt(m.val.start, f, ErrInvalid, "%v", err)
					continue
				}
				r.urls = append(r.urls, p)
			}
			r.hasURLs = true
			if len(ss) == 0 {
				never(m, "no URL or host it could match")
			}
		case "args":
			if !dc.object(m.val, f) {
				continue
			}
			for _, am := range m.val.keys {
				p, err := compilePointer(am.name)
				if err != nil {
					dc.errAt(am.start, f, ErrInvalid, "%v", err)
					continue
				}
				g, ok := dc.str(am, f+"."+am.name)
				if !ok {
					continue
				}
				r.args = append(r.args, argCond{ptr: p, glob: g})
			}
		case "labels":
			ls, ok := dc.labels(m.val, f)
			if !ok {
				continue
			}
			r.labels, r.hasLabels = ls, true
			if len(ls) == 0 {
				never(m, "an empty list of labels")
			}
		case "where":
			s, ok := dc.str(m, f)
			if !ok {
				continue
			}
			switch s {
			case "local":
				r.where = whereLocal
			case "cloud":
				r.where = whereCloud
			default:
				dc.errAt(m.val.start, f, ErrInvalid, "%q: want local or cloud", s)
			}
		}
	}
	if len(dc.d.errs) > nerr {
		return nil
	}
	return r
}

// join returns the errors of docs as one error, nil if none.
func join(docs []*doc) error {
	var errs []error
	for _, d := range docs {
		errs = append(errs, d.errs...)
	}
	return errors.Join(errs...)
}
