package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel/policy"
)

// policyRules is how many rules the policy of the -policy mode holds.
const policyRules = 1000

// switchedPolicy is the policy in force (engine.Policy), switched on
// and off between runs: off, the engine has no policy at all, as for a
// user with no policy file.
type switchedPolicy struct{ p atomic.Pointer[policy.Policy] }

func (sw *switchedPolicy) Current() policy.Snapshot {
	p := sw.p.Load()
	if p == nil {
		return policy.Snapshot{}
	}
	return policy.Snapshot{Policy: p, Version: 1}
}

func (sw *switchedPolicy) CurrentFor(string) policy.Snapshot { return sw.Current() }

func (sw *switchedPolicy) Use(string) (func(), error) { return func() {}, nil }

// benchPolicy compiles a policy of policyRules rules over the managed and
// user layers, none of which matches the workload (tool rules naming
// other tools, some with a path or URL; rules for every tool with a path
// or URL the echo calls do not name; model rules for other providers;
// egress and knowledge rules), plus one rule that allows the workload's
// echo tool: every decision of the workload reads the rules that could
// apply and allows.
func benchPolicy() (*policy.Policy, error) {
	var managed, user []string
	outcomes := []string{"allow", "ask", "deny"}
	for i := range 8 {
		managed = append(managed, fmt.Sprintf(`{"action": "tool", "path": "~/.secret%d/**", "decision": "deny"}`, i))
		user = append(user, fmt.Sprintf(`{"action": "tool", "url": "https://*.internal%d.test", "decision": "deny"}`, i))
	}
	user = append(user, `{"action": "tool", "tool": "echo", "decision": "allow"}`)
	for i := 0; len(managed)+len(user) < policyRules; i++ {
		o := outcomes[i%3]
		var r string
		switch i % 5 {
		case 0:
			r = fmt.Sprintf(`{"action": "tool", "tool": "tool%d", "decision": %q}`, i, o)
		case 1:
			r = fmt.Sprintf(`{"action": "tool", "tool": "tool%d", "path": "/srv/data%d/**", "decision": %q}`, i, i, o)
		case 2:
			r = fmt.Sprintf(`{"action": "egress", "tool": "tool%d", "url": "https://host%d.example.com", "decision": %q}`, i, i, o)
		case 3:
			r = fmt.Sprintf(`{"action": "model", "provider": "provider%d", "model": "m%d-*", "decision": %q}`, i, i, o)
		case 4:
			r = fmt.Sprintf(`{"action": "knowledge", "scope": "scope%d/**", "decision": %q}`, i, o)
		}
		if i%2 == 0 {
			managed = append(managed, r)
		} else {
			user = append(user, r)
		}
	}
	file := func(l policy.Layer, rules []string) policy.LayerFile {
		return policy.LayerFile{Layer: l, Name: l.String() + ".json", Data: []byte(`{"rules": [` + strings.Join(rules, ",\n") + `]}`)}
	}
	p, err := policy.Compile(policy.Options{Home: "/home/bench"}, file(policy.LayerManaged, managed), file(policy.LayerUser, user))
	if err != nil {
		return nil, err
	}
	if n := len(p.Rules()); n != policyRules {
		return nil, fmt.Errorf("the policy has %d rules, want %d", n, policyRules)
	}
	return p, nil
}

// policyResult is the step time of one run with the policy off and on.
type policyResult struct {
	sync    string
	off, on time.Duration // median per step
	ratio   float64       // median of the reps' on/mean(off, off again)
	lo, hi  float64       // the ratio's 95% confidence interval (medianCI)
	noise   float64       // median of the reps' off/off: the noise floor
	// cpuOff and cpuOn are the process's CPU time per step, medians
	// (0 where it cannot be read).
	cpuOff, cpuOn time.Duration
	// cpuRatio and cpuNoise are the medians of the reps' CPU time on/off
	// and off/off.
	cpuRatio, cpuNoise float64
}

// measurePolicy times reps sets of single runs of n steps on one engine
// and database file, runs with no policy and with the 1,000-rule policy
// in force taking turns, so that both meet the same file and the same
// disk.
func measurePolicy(ctx context.Context, dir, synchronous string, n, reps int) (policyResult, error) {
	p, err := benchPolicy()
	if err != nil {
		return policyResult{}, err
	}
	sw := &switchedPolicy{}
	b, err := newPolicyBed(ctx, filepath.Join(dir, "keel-policy-"+synchronous+".db"), synchronous, chain{n}, n, sw)
	if err != nil {
		return policyResult{}, err
	}
	defer b.Close()
	for i := 0; b.st.Commits() < warmCommits; i++ {
		if i%2 == 0 {
			sw.p.Store(p)
		} else {
			sw.p.Store(nil)
		}
		if _, err := runAll(ctx, b, fmt.Sprintf("warm-up-%d", i), 1, n); err != nil {
			return policyResult{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	one := func(withPolicy bool, i int) (wall, cpu time.Duration, err error) {
		// Runs go one at a time: the switch applies to the run started next.
		if withPolicy {
			sw.p.Store(p)
		} else {
			sw.p.Store(nil)
		}
		c0 := cpuTime()
		bt, err := runAll(ctx, b, fmt.Sprintf("one-%d-%v", i, withPolicy), 1, n)
		if err != nil {
			return 0, 0, err
		}
		if bt.steps != int64(n) {
			return 0, 0, fmt.Errorf("the run made %d steps, want %d", bt.steps, n)
		}
		err = b.st.Sync(ctx)
		return bt.elapsed / time.Duration(n), (cpuTime() - c0) / time.Duration(n), err
	}
	// Each rep times three runs, policy off, on and off again, in one of
	// the six orders, each order equally often (a rotation would always
	// put the same kind of run before another, and what a run leaves
	// behind, such as the GC's pacing, biases the next). The policy's
	// ratio is on against the mean of the two offs; the noise floor is
	// the second off against the first (an A/A ratio).
	orders := [6][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	offs, ons, cpuOffs, cpuOns := make([]time.Duration, reps), make([]time.Duration, reps), make([]time.Duration, reps), make([]time.Duration, reps)
	ratios, noise, cpuRatios, cpuNoise := make([]float64, reps), make([]float64, reps), make([]float64, reps), make([]float64, reps)
	for i := range reps {
		var got, cpu [3]time.Duration // off, on, off again
		for k, j := range orders[i%6] {
			if got[j], cpu[j], err = one(j == 1, i*3+k); err != nil {
				return policyResult{}, err
			}
		}
		offs[i], ons[i], cpuOffs[i], cpuOns[i] = got[0], got[1], cpu[0], cpu[1]
		ratios[i], noise[i] = 2*float64(got[1])/float64(got[0]+got[2]), float64(got[2])/float64(got[0])
		if cpu[0] > 0 {
			cpuRatios[i], cpuNoise[i] = 2*float64(cpu[1])/float64(cpu[0]+cpu[2]), float64(cpu[2])/float64(cpu[0])
		}
	}
	for _, s := range [][]time.Duration{offs, ons, cpuOffs, cpuOns} {
		slices.Sort(s)
	}
	for _, s := range [][]float64{ratios, noise, cpuRatios, cpuNoise} {
		slices.Sort(s)
	}
	lo, hi := medianCI(ratios)
	return policyResult{sync: synchronous, off: offs[reps/2], on: ons[reps/2], ratio: ratios[reps/2], lo: lo, hi: hi, noise: noise[reps/2],
		cpuOff: cpuOffs[reps/2], cpuOn: cpuOns[reps/2], cpuRatio: cpuRatios[reps/2], cpuNoise: cpuNoise[reps/2]}, nil
}

// measurePolicySide times reps single runs of n steps with the policy
// in force (on) or none, alone in this process, after the same warm-up
// as measurePolicy: the median wall-clock and CPU time per step.
func measurePolicySide(ctx context.Context, dir, synchronous string, n, reps int, on bool) (wall, cpu time.Duration, err error) {
	p, err := benchPolicy()
	if err != nil {
		return 0, 0, err
	}
	sw := &switchedPolicy{}
	if on {
		sw.p.Store(p)
	}
	b, err := newPolicyBed(ctx, filepath.Join(dir, "keel-policy-"+synchronous+".db"), synchronous, chain{n}, n, sw)
	if err != nil {
		return 0, 0, err
	}
	defer b.Close()
	for i := 0; b.st.Commits() < warmCommits; i++ {
		if _, err := runAll(ctx, b, fmt.Sprintf("warm-up-%d", i), 1, n); err != nil {
			return 0, 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	walls, cpus := make([]time.Duration, reps), make([]time.Duration, reps)
	for i := range reps {
		c0 := cpuTime()
		bt, err := runAll(ctx, b, fmt.Sprintf("one-%d", i), 1, n)
		if err != nil {
			return 0, 0, err
		}
		if bt.steps != int64(n) {
			return 0, 0, fmt.Errorf("the run made %d steps, want %d", bt.steps, n)
		}
		if err := b.st.Sync(ctx); err != nil {
			return 0, 0, err
		}
		walls[i], cpus[i] = bt.elapsed/time.Duration(n), (cpuTime()-c0)/time.Duration(n)
	}
	slices.Sort(walls)
	slices.Sort(cpus)
	return walls[reps/2], cpus[reps/2], nil
}

// runPolicy is the -policy mode: the policy comparison alone, at each
// synchronous setting; with -policy-only, one side of it.
func runPolicy(ctx context.Context, cfg config, dir string) error {
	if cfg.policyIn != "" {
		for _, s := range cfg.syncs {
			progress("%s: keel, policy %s only, %d runs of %d steps", s, cfg.policyIn, cfg.reps, cfg.n)
			wall, cpu, err := measurePolicySide(ctx, dir, s, cfg.n, cfg.reps, cfg.policyIn == "on")
			if err != nil {
				return fmt.Errorf("synchronous=%s: %w", s, err)
			}
			fmt.Printf("synchronous=%-6s policy %-3s per step: %s wall, %s CPU (medians of %d runs of %d steps)\n", s, cfg.policyIn, dur(wall), dur(cpu), cfg.reps, cfg.n)
		}
		return nil
	}
	fmt.Printf("policy on vs off: one run of %d steps (echo tool calls), median of %d reps; policy of %d rules, none matching but one allow\n",
		cfg.n, cfg.reps, policyRules)
	for _, s := range cfg.syncs {
		progress("%s: keel, policy off vs on, %d reps of 3 runs of %d steps", s, cfg.reps, cfg.n)
		r, err := measurePolicy(ctx, dir, s, cfg.n, cfg.reps)
		if err != nil {
			return fmt.Errorf("synchronous=%s: %w", s, err)
		}
		fmt.Printf("synchronous=%-6s per step: policy off %s, on %s; on/off %.3f (%+.1f%%, 95%% CI %+.1f%% to %+.1f%%); noise floor off/off %.3f (%+.1f%%)\n",
			r.sync, dur(r.off), dur(r.on), r.ratio, (r.ratio-1)*100, (r.lo-1)*100, (r.hi-1)*100, r.noise, (r.noise-1)*100)
		if r.cpuOff > 0 {
			fmt.Printf("synchronous=%-6s CPU per step: policy off %s, on %s; on/off %.3f; noise floor off/off %.3f\n",
				r.sync, dur(r.cpuOff), dur(r.cpuOn), r.cpuRatio, r.cpuNoise)
		}
	}
	return nil
}

// medianCI is a distribution-free 95% confidence interval of the median
// of sorted xs: the order statistics around n/2 ± 1.96·√n/2 (the
// binomial's normal approximation), so that the noise of single reps
// shows as a range instead of being read as a difference.
func medianCI(xs []float64) (lo, hi float64) {
	n := len(xs)
	if n == 0 {
		return 0, 0
	}
	d := int(math.Ceil(1.96 * math.Sqrt(float64(n)) / 2))
	return xs[max(0, n/2-d)], xs[min(n-1, n/2+d)]
}
