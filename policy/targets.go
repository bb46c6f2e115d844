package policy

// targetRules says which tools' calls a path or url rule (url and host
// conditions) of kind tool may match: computed once, at Compile.
type targetRules struct {
	tools map[string]bool // tools a rule names exactly
	all   bool            // a rule for any tool
	globs []string        // tool globs of the others
}

// indexTargets reads the tool rules of b (the index of kind tool) that
// have path or url conditions.
func indexTargets(b *bucket) targetRules {
	var t targetRules
	for key, rs := range b.exact {
		for _, r := range rs {
			if r.hasPaths || r.hasURLs {
				if t.tools == nil {
					t.tools = map[string]bool{}
				}
				t.tools[key] = true
				break
			}
		}
	}
	for _, r := range b.any {
		switch {
		case !r.hasPaths && !r.hasURLs:
		case r.tool == "" || r.tool == "*":
			t.all = true
		default:
			t.globs = append(t.globs, r.tool)
		}
	}
	return t
}

// NeedsTargets reports whether a rule of the policy could look at the
// paths or URLs a call of tool names (Action.Paths, Action.URLs,
// Action.Unresolvable): some tool rule for this tool, or for a glob that
// matches it, or for any tool, has a path, url or host condition. When
// it reports false, Decide of a tool call gives the same decision with
// or without them, so a caller may skip working them out. A nil policy
// needs none. Safe for concurrent use; it does not allocate.
func (p *Policy) NeedsTargets(tool string) bool {
	if p == nil {
		return false
	}
	t := &p.targets
	if t.all || t.tools[tool] {
		return true
	}
	for _, g := range t.globs {
		if wildcard(g, tool, 0) {
			return true
		}
	}
	return false
}
