package wasmtools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/schema"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// Call runs the named tool on input and returns its output. A reactor
// tool runs on an idle pooled instance when there is one (a new one
// otherwise, and always with fresh isolation); a command tool runs in a
// fresh instance. While the tools found at Open are still loading, a
// call waits for its own tool only. Every error is a *keel.ToolError:
//
//   - not_found: no tool has that name (or its file failed to load).
//   - permission_denied: the manifest requests something (a directory,
//     an environment variable, a network destination) that was not
//     granted; the tool does not run.
//   - invalid_input: input is not JSON or breaks the input schema; Path
//     is the JSON pointer of the failing field. Empty input counts as {}.
//   - timeout: the call outlived Config.CallTimeout or ctx (also while
//     waiting for its tool to load), or the registry was closed; the
//     message says which.
//   - resource_exhausted: the tool hit the memory limit (linear memory
//     and tables), overflowed its stack, wrote more than
//     Config.MaxOutputBytes to stdout, or had a write through a
//     read-write grant refused by Config.WriteQuotaBytes or
//     Config.MinFreeDiskBytes (see DiskLimitError). A stack overflow is
//     always this code, even if the deadline passed meanwhile: it meets
//     wazero's ceiling on the call stack (the message says "stack
//     overflow") or, for a runtime that keeps its stack in linear memory
//     as Go does, the memory limit (the message names it). Only a guest
//     that reached no limit by the deadline is a timeout.
//   - crashed: the tool trapped, exited non-zero or wrote something that
//     is not a result object.
//   - tool_error: the tool reported its own error, or its output broke
//     its output schema.
//
// Config.Interceptors see the call before and after it runs (package
// intercept): a call one of them denies does not run and fails with
// permission_denied. inv.Run, Step and CallID say who calls (zero for a
// direct call); the registry itself reads Name and Args, and:
//
//   - Touched, when not nil, is set to what the call reached once it
//     has ended (also when it failed; zero when the tool did not run):
//     the host paths it opened through its grants, resolved as the
//     sandbox resolved them, deduplicated in first-open order, at most
//     keel.MaxTouchedPaths (then Truncated); the host:port of every
//     network request it made or tried, allowed or refused; and the
//     labels of the grants its instance opened files through (a pooled
//     instance's earlier calls included: what they read may still be in
//     its memory) with those its manifest declares; and the requests
//     Egress refused with a *keel.EgressRefusal. Nothing is written
//     to it after Call returns.
//   - Egress, when not nil, is asked before each network request and
//     each redirect the grants allow, with the destination URL; an error
//     refuses the request: the tool sees a permission_denied network
//     error giving the reason, and the call fails with permission_denied
//     naming the destination and the reason (or with the code of the
//     error, if it is a *keel.ToolError).
func (r *Registry) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Touched != nil {
		*inv.Touched = keel.Touched{}
	}
	if len(r.cfg.Interceptors) == 0 {
		out, _, terr := r.call(ctx, inv)
		if terr != nil {
			return nil, terr
		}
		return out, nil
	}
	o := r.cfg.Interceptors.Call(ctx, inv, func(ctx context.Context) intercept.ToolOutcome {
		out, t, terr := r.call(ctx, inv)
		o := intercept.ToolOutcome{Output: out, Err: terr}
		if t != nil {
			o.Build = intercept.ToolBuild{Version: t.info.Spec.Version, SHA256: t.info.SHA256, Grants: grantStrings(t.info.Grants), SideEffects: t.info.Spec.SideEffects}
		}
		return o
	})
	if o.Err != nil {
		return nil, o.Err
	}
	return o.Output, nil
}

// call runs the tool inv names on its input (see Call); t is the tool
// that ran, nil when there is none by that name.
func (r *Registry) call(ctx context.Context, inv keel.ToolInvocation) (_ json.RawMessage, t *tool, _ *keel.ToolError) {
	name, input := inv.Name, inv.Args
	t, err := r.lookup(ctx, name)
	if err != nil {
		return nil, nil, &keel.ToolError{Code: keel.ToolTimeout, Message: fmt.Sprintf("tool %s is still being compiled: %v", name, err)}
	}
	if t == nil {
		return nil, nil, &keel.ToolError{Code: keel.ToolNotFound, Message: fmt.Sprintf("no tool named %q is installed", name)}
	}
	if t.missing != "" {
		return nil, t, &keel.ToolError{Code: keel.ToolPermissionDenied, Message: fmt.Sprintf("tool %s needs %s, which is not granted", name, t.missing)}
	}
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}") // models send no arguments for tools without parameters
	}
	if v, err := t.input.Validate(input); err != nil {
		return nil, t, &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf("input is not valid JSON: %v", err)}
	} else if v != nil {
		return nil, t, &keel.ToolError{Code: keel.ToolInvalidInput, Path: v.Pointer, Message: v.Message}
	}
	if !r.begin() {
		return nil, t, &keel.ToolError{Code: keel.ToolTimeout, Message: "the tool runtime is closed"}
	}
	defer r.calls.Done()
	compiled, terr := r.acquire(ctx, t)
	if terr != nil {
		return nil, t, terr
	}
	defer r.unuse(t) // after the instance is back in the pool
	if r.cfg.testHookCall != nil {
		r.cfg.testHookCall(name)
	}

	late := "" // the time limit's message, made only if needed (see failure)
	if d, ok := ctx.Deadline(); ok && time.Until(d) < t.limits.timeout {
		late = "tool did not finish before the caller's deadline"
	}
	ctx, cancel := context.WithTimeout(ctx, t.limits.timeout)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)()

	var touch *callTouch
	if inv.Touched != nil {
		touch = new(callTouch)
	}
	ctx, nc := r.withNet(ctx, t, touch, inv.Egress)
	start := time.Now()
	var o outcome
	var inst *instance
	var disk diskUse
	var use *fsUse
	if t.pool == nil {
		var mc wazero.ModuleConfig
		mc, disk, use = r.instanceConfig(t)
		o = r.run(ctx, compiled, mc, input, t.limits, use, touch)
	} else {
		if inst, o = r.callReactor(ctx, t, compiled, input, touch); inst != nil {
			disk, use = inst.disk, inst.fs
		}
	}
	if touch != nil {
		touch.fill(inv.Touched, use, t.info.Labels)
	}
	out, terr := r.result(ctx, t, o, late)
	if denied := nc.denial(); denied != nil {
		// A refused request fails the call as a whole, whatever the tool
		// made of the refusal, so the denial is never swallowed.
		terr = denied
	} else if full := disk.refusal(); full != nil {
		// So is a write refused by a disk limit (see disk.go).
		terr = &keel.ToolError{Code: keel.ToolResourceExhausted, Message: full.Error()}
	}
	disk.reset()
	if inst != nil {
		// An instance goes back to the pool only after a clean call or
		// the tool's own error; after anything else (trap, timeout, a
		// limit hit, a malformed result) its state is suspect.
		if !t.fresh && !inst.interrupted && (terr == nil || terr.Code == keel.ToolFailed) {
			t.pool.put(ctx, inst)
		} else {
			inst.close(ctx)
		}
	}
	attrs := []any{logkey.Tool, name, logkey.Duration, time.Since(start)}
	switch {
	case terr == nil:
		r.log.Debug("wasmtools: call", attrs...)
	case terr.Code == keel.ToolFailed:
		r.log.Debug("wasmtools: call failed", append(attrs, logkey.Err, terr)...)
	default:
		r.log.Warn("wasmtools: call failed", append(attrs, logkey.Err, terr, logkey.Cause, o.err, logkey.Stderr, string(o.stderr))...)
	}
	if terr != nil {
		return nil, t, terr
	}
	return out, t, nil
}

func (r *Registry) begin() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.calls.Add(1)
	return true
}

// outcome is what one instance run left behind.
type outcome struct {
	stdout, stderr []byte
	err            error // from InstantiateModule: trap, exit code or context
	memoryExceeded bool
	outputExceeded bool
}

// run instantiates compiled and runs its _start to the end, with the
// given stdin and fresh stdout, stderr and memory, capped by lim. ctx's
// end interrupts the guest.
//
// use records what the instance opens through its grants, and touch,
// when not nil, what the call opens (see touched.go).
func (r *Registry) run(ctx context.Context, compiled wazero.CompiledModule, mc wazero.ModuleConfig, stdin []byte, lim limits, use *fsUse, touch *callTouch) outcome {
	mem := &memoryCap{limit: lim.memoryBytes()}
	stdout := &limitedWriter{limit: lim.output, fail: true}
	stderr := &limitedWriter{limit: stderrLimit}
	mc = mc.WithStdin(bytes.NewReader(stdin)).
		WithStdout(stdout).
		WithStderr(stderr).
		WithNanosleep(sleeper(ctx)).
		WithStartFunctions() // the start function and _start run below, under the interrupt
	mod, err := r.rt.InstantiateModule(experimental.WithMemoryAllocator(ctx, mem), compiled, mc)
	if err == nil {
		mem.bind(mod)
		use.begin(touch)
		disarm := armInterrupt(ctx, interruptOf(mod))
		if err = callStart(ctx, mod); err == nil {
			_, err = mod.ExportedFunction("_start").Call(ctx)
		}
		disarm()
		use.end()
		var exit *sys.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 0 {
			err = nil // proc_exit(0) is a clean end
		}
	}
	if mod != nil {
		_ = mod.Close(context.WithoutCancel(ctx))
	}
	return outcome{
		stdout:         stdout.buf.Bytes(),
		stderr:         stderr.buf.Bytes(),
		err:            err,
		memoryExceeded: mem.hit(),
		outputExceeded: stdout.exceeded,
	}
}

// callStart runs mod's start function, if it has one (instrument takes
// it out of the instantiation, so that it runs under the interrupt).
func callStart(ctx context.Context, mod api.Module) error {
	if f := mod.ExportedFunction(startExport); f != nil {
		_, err := f.Call(ctx)
		return err
	}
	return nil
}

// interruptOf returns mod's interrupt global (see instrument).
func interruptOf(mod api.Module) api.MutableGlobal { return exportedGlobal(mod, interruptGlobal) }

// armInterrupt makes ctx's end stop the guest code of the module whose
// interrupt global is g at its next loop header (see instrument). The
// returned function disarms it and reports whether the interrupt stayed
// unfired, that is whether the instance is still fit for another call.
func armInterrupt(ctx context.Context, g api.MutableGlobal) (disarm func() bool) {
	return context.AfterFunc(ctx, func() { g.Set(1) })
}

// callReactor runs one call on an instance of a reactor tool: an idle one
// from the pool, or a new one. It returns the instance, nil if it could
// not be started, for the caller to put back or close. touch, when not
// nil, records what the call opens (see touched.go).
func (r *Registry) callReactor(ctx context.Context, t *tool, compiled wazero.CompiledModule, input []byte, touch *callTouch) (*instance, outcome) {
	var inst *instance
	if !t.fresh {
		inst = t.pool.get()
	}
	if inst == nil {
		t.pool.instantiations.Add(1)
		var o outcome
		mc, disk, use := r.instanceConfig(t)
		if inst, o = r.instantiate(ctx, compiled, mc, t.limits); inst == nil {
			return nil, o
		}
		inst.disk, inst.fs = disk, use
	}
	if r.cfg.testHookInstance != nil {
		r.cfg.testHookInstance(t.info.Spec.Name)
	}
	inst.fs.begin(touch)
	defer inst.fs.end()
	return inst, r.invoke(ctx, inst, input)
}

// sleeper is the guest's nanosleep (poll_oneoff with a clock): a real
// sleep that ends early when ctx is done, so a sleeping guest cannot
// outlive its call.
func sleeper(ctx context.Context) sys.Nanosleep {
	return func(ns int64) { sleep(ctx, ns) }
}

func sleep(ctx context.Context, ns int64) {
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// failure classifies a run that did not end cleanly under lim; nil means
// the guest exited 0 within its limits. late is the message for a run
// that ran out of time; "" names the call's time limit.
func (r *Registry) failure(ctx context.Context, o outcome, late string, lim limits) *keel.ToolError {
	switch {
	case o.outputExceeded:
		return &keel.ToolError{Code: keel.ToolResourceExhausted, Message: fmt.Sprintf("tool output exceeded the limit of %d bytes", lim.output)}
	case o.err == nil:
		return nil
	case o.memoryExceeded:
		return &keel.ToolError{Code: keel.ToolResourceExhausted, Message: fmt.Sprintf("tool exceeded its memory limit of %d MiB (linear memory and tables)", lim.memoryMiB)}
	case errors.Is(o.err, errStackOverflow()):
		// Before the deadline's cases: the guest trapped on its stack,
		// not on the interrupt, even if the deadline passed meanwhile.
		return &keel.ToolError{Code: keel.ToolResourceExhausted, Message: "tool exceeded its stack limit (stack overflow)"}
	case r.ctx != nil && r.ctx.Err() != nil:
		return &keel.ToolError{Code: keel.ToolTimeout, Message: "tool stopped: the tool runtime is closing"}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		if late == "" {
			late = fmt.Sprintf("tool did not finish within its time limit of %s", lim.timeout)
		}
		return &keel.ToolError{Code: keel.ToolTimeout, Message: late}
	case ctx.Err() != nil:
		return &keel.ToolError{Code: keel.ToolTimeout, Message: "tool stopped: the call was cancelled"}
	}
	var exit *sys.ExitError
	if errors.As(o.err, &exit) {
		return &keel.ToolError{Code: keel.ToolCrashed, Message: fmt.Sprintf("tool exited with code %d%s", exit.ExitCode(), stderrHint(o.stderr))}
	}
	// A Go reactor that panics aborts with a trap rather than an exit;
	// the reason is on stderr.
	return &keel.ToolError{Code: keel.ToolCrashed, Message: "tool trapped: " + firstLine(o.err.Error()) + stderrHint(o.stderr)}
}

// result turns a run into the call's output or error.
func (r *Registry) result(ctx context.Context, t *tool, o outcome, late string) (json.RawMessage, *keel.ToolError) {
	if f := r.failure(ctx, o, late, t.limits); f != nil {
		return nil, f
	}
	if out, ok := knownOutput(t, o.stdout); ok {
		return out, nil
	}
	out, toolErr, err := parseResult(o.stdout)
	switch {
	case err != nil:
		return nil, &keel.ToolError{Code: keel.ToolCrashed, Message: "tool wrote a malformed result: " + err.Error()}
	case toolErr != nil:
		return nil, toolErr
	}
	if t.output != nil {
		v, err := t.output.Validate(out)
		if err == nil && v != nil {
			at := v.Pointer
			if at == "" {
				at = "/"
			}
			err = fmt.Errorf("at %s: %s", at, v.Message)
		}
		if err != nil {
			return nil, &keel.ToolError{Code: keel.ToolFailed, Message: "tool broke its contract: its output does not match its output schema: " + err.Error()}
		}
	}
	return out, nil
}

// knownOutput takes the output out of a result of the form the toolkit
// writes, {"output":VALUE}, when one pass over VALUE's bytes shows it is
// one JSON value that meets t's output schema (any value, for a tool
// without one). Otherwise ok is false, and result parses and checks the
// result in full, which also explains what is wrong.
func knownOutput(t *tool, stdout []byte) (_ json.RawMessage, ok bool) {
	b, ok := bytes.CutPrefix(bytes.TrimSpace(stdout), []byte(`{"output":`))
	if !ok {
		return nil, false
	}
	if b, ok = bytes.CutSuffix(b, []byte("}")); !ok {
		return nil, false
	}
	if t.output != nil && !t.output.Valid(b) || t.output == nil && !schema.IsJSON(b) {
		return nil, false
	}
	if bytes.ContainsAny(b, " \t\r\n") {
		b = compact(b)
	}
	return b, true
}

// parseResult reads the one JSON object a tool writes to stdout (when
// knownOutput could not):
// {"output": value} or {"error": {"message": "...", "code": "..."}}.
func parseResult(stdout []byte) (json.RawMessage, *keel.ToolError, error) {
	b := bytes.TrimSpace(stdout)
	if len(b) == 0 {
		return nil, nil, errors.New("nothing on stdout")
	}
	if b[0] != '{' {
		return nil, nil, errors.New("stdout is not a JSON object")
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&fields); err != nil {
		return nil, nil, fmt.Errorf("stdout is not JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("stdout has more than one JSON value")
	}
	if len(fields) == 1 {
		if out, ok := fields["output"]; ok {
			return compact(out), nil, nil
		}
		if raw, ok := fields["error"]; ok {
			var e struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || strings.TrimSpace(e.Message) == "" {
				return nil, nil, errors.New(`"error" must be an object with a non-empty "message"`)
			}
			msg := e.Message
			if e.Code != "" {
				msg = e.Code + ": " + msg
			}
			return nil, &keel.ToolError{Code: keel.ToolFailed, Message: msg}, nil
		}
	}
	return nil, nil, errors.New(`the result object must have exactly one field, "output" or "error"`)
}

// stderrHint quotes the first line of stderr, where runtimes put the
// reason (Go: "panic: ..." or "fatal error: ...").
func stderrHint(stderr []byte) string {
	line := firstLine(string(stderr))
	if line == "" {
		return ""
	}
	return " (stderr: " + line + ")"
}

func firstLine(s string) string {
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 200 {
				line = line[:200] + "…"
			}
			return line
		}
	}
	return ""
}
