package wasmtools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Compiling out of process.
//
// wazero's optimizing compiler holds some 450 MiB of heap while it
// compiles one Go-built module, and Go lets the heap reach twice its live
// set: a daemon that compiled in process peaked at 1.3 GiB over a cold
// start of 10 tools, and only slowly handed that back. With a Compiler,
// each tool file is compiled and inspected (its module checked, its
// manifest asked for) by a short-lived child process, which writes the
// compiled code into the compilation cache and prints what it found as
// JSON. The daemon builds the tool from that, unloaded (see unload.go):
// its first call loads the compiled code from the cache, which takes a
// file read and a decode, not a compile. All of the compile's memory
// goes back to the system when the child exits, and a compiler crash or
// blow-up on a hostile module ends the child, not the daemon.
//
// The child builds its runtime with newRegistry, as Open does, so its
// cache keys are the daemon's. One child runs at a time per registry:
// the machine's peak is one compile, not one per core. What a child
// found is kept in the cache too ("inspected"), so a restart builds its
// tools without starting any child. That record does not prove that
// wazero's compiled code is still beside it: if only that was deleted,
// the tool's first call compiles it in process (see compileAgain).

// compileChildEnv marks a process started as a compile child.
const compileChildEnv = "KEEL_WASMTOOLS_COMPILE_CHILD"

// Defaults for the zero fields of Compiler.
const (
	DefaultCompileTimeout        = 5 * time.Minute
	DefaultCompileMemoryLimitMiB = 2048
	// DefaultCompileSoftLimitMiB is the Go soft memory limit
	// (debug.SetMemoryLimit) of a compile child; see Compiler.
	DefaultCompileSoftLimitMiB = 384
)

// Compiler runs the compilation of tools in child processes (see
// Config.Compiler). The zero value of every field but Path takes the
// default it documents. A Compiler is read once by Open.
type Compiler struct {
	// Path is the program to start: one whose main, before anything
	// else, calls CompileChildMain when IsCompileChild reports true (the
	// keel binary itself, from os.Executable). Required.
	Path string
	// Args are the program's arguments after its name; default none.
	Args []string
	// Env is added to the child's environment, which is otherwise the
	// daemon's. Default nothing.
	Env []string
	// Timeout bounds one child, from its start to its reply; it is
	// killed after it and the tool fails with ErrCompileTimeout. It
	// includes asking the module for its manifest, which
	// Config.CallTimeout bounds on its own. Default 5 minutes.
	Timeout time.Duration
	// MemoryLimitMiB is the resident memory at which a child is killed
	// and the tool fails with ErrCompileOutOfMemory. It is watched from
	// the parent every few milliseconds, on Linux only. Default 2048.
	MemoryLimitMiB int
	// SoftLimitMiB is the child's Go soft memory limit: past it, the
	// child's garbage collector runs more often, so a compile needs less
	// memory and takes longer. Default 384, about the live heap of one
	// worker compiling a Go module; negative: no soft limit.
	SoftLimitMiB int
	// Workers is how many functions a child compiles at once. Each
	// worker keeps its own scratch memory, grown to fit the largest
	// function it met (about 200 MiB for a Go module), so a child's peak
	// grows with them: 440 MiB with one worker, 600 MiB with two, for a
	// Go module of 5 MB. Default 1.
	Workers int
}

// Errors of a compile child that did not reply, each wrapped in a
// *CompileError. A module the child found unusable is not one of them:
// it is reported like a module that fails to load in process.
var (
	// ErrCompileCrashed: the child exited, or was killed by a signal it
	// was not sent by keel, without a reply.
	ErrCompileCrashed = errors.New("the compile process crashed")
	// ErrCompileOutOfMemory: the child's memory passed
	// Compiler.MemoryLimitMiB and keel killed it.
	ErrCompileOutOfMemory = errors.New("the compile process ran out of memory")
	// ErrCompileTimeout: the child outlived Compiler.Timeout and keel
	// killed it.
	ErrCompileTimeout = errors.New("the compile process did not finish in time")
)

// CompileError is a compile child's failure: Err is one of the sentinels
// above, or the context's error when the load was stopped (the registry
// closing, the caller giving up) and the child killed for it.
type CompileError struct {
	Tool string
	Err  error
	// Detail says how the child ended (exit status, signal, memory) and
	// holds the end of what it wrote to stderr.
	Detail string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("compile %s: %v (%s)", e.Tool, e.Err, e.Detail)
}

// Unwrap returns Err and, when the child crashed, ran out of memory or
// out of time on the module, keel.ErrUnusableTool: the module could not
// be compiled within the limits. A child stopped by its context is not
// the module's fault.
func (e *CompileError) Unwrap() []error {
	switch e.Err {
	case ErrCompileCrashed, ErrCompileOutOfMemory, ErrCompileTimeout:
		return []error{e.Err, keel.ErrUnusableTool}
	}
	return []error{e.Err}
}

// childCompiles reports whether tools compile in a child: only with a
// Compiler and a cache for the child to write to, and never in a compile
// child itself, so that a Path whose main forgot to call
// CompileChildMain cannot start children without end.
func (r *Registry) childCompiles() bool {
	return r.cfg.Compiler != nil && r.cfg.Compiler.Path != "" && r.cache != nil && !IsCompileChild()
}

// childRequest is what a compile child is asked, as JSON on its stdin.
type childRequest struct {
	Name           string        `json:"name"`
	File           string        `json:"file"`
	CacheDir       string        `json:"cache_dir"`
	CallTimeout    time.Duration `json:"call_timeout"`
	MemoryLimitMiB int           `json:"memory_limit_mib"`
	MaxOutputBytes int           `json:"max_output_bytes"`
	SoftLimitMiB   int           `json:"soft_limit_mib"`
	Workers        int           `json:"workers"`
}

// childReply is a compile child's answer on its stdout: an inspection,
// or why the tool could not be inspected. Unusable and Unsupported carry
// across the process what the error matched in the child
// (keel.ErrUnusableTool, an *UnsupportedError's feature).
type childReply struct {
	Inspection  *inspection `json:"inspection,omitempty"`
	Error       string      `json:"error,omitempty"`
	Unusable    bool        `json:"unusable,omitempty"`
	Unsupported string      `json:"unsupported,omitempty"`
}

// childError is the error a compile child replied with: its text, and
// what it matched there.
type childError struct {
	msg         string
	unusable    bool
	unsupported *UnsupportedError
}

func (e *childError) Error() string { return e.msg }

func (e *childError) Unwrap() []error {
	var out []error
	if e.unsupported != nil {
		out = append(out, e.unsupported)
	}
	if e.unusable {
		out = append(out, keel.ErrUnusableTool)
	}
	return out
}

// IsCompileChild reports whether this process was started as a compile
// child by a Registry with a Compiler.
func IsCompileChild() bool { return os.Getenv(compileChildEnv) == "1" }

// CompileChildMain is a compile child's whole life: it reads one request
// from stdin, compiles and inspects that tool file into the compilation
// cache, writes its reply to stdout and returns the process's exit code
// (0 when it replied, whatever the module). A program that can be a
// Compiler's Path calls it first thing in main when IsCompileChild:
//
//	if wasmtools.IsCompileChild() {
//		os.Exit(wasmtools.CompileChildMain(ctx, os.Stdin, os.Stdout))
//	}
func CompileChildMain(ctx context.Context, stdin io.Reader, stdout io.Writer) int {
	return compileChild(ctx, stdin, stdout, nil)
}

// compileChild is CompileChildMain; tests pass hook, which sees the
// request before the work starts.
func compileChild(ctx context.Context, stdin io.Reader, stdout io.Writer, hook func(childRequest)) int {
	var req childRequest
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "keel compile child: bad request:", err)
		return 2
	}
	if hook != nil {
		hook(req)
	}
	if req.SoftLimitMiB > 0 {
		debug.SetMemoryLimit(int64(req.SoftLimitMiB) << 20)
	}
	r, err := newRegistry(ctx, Config{
		Dir:            filepath.Dir(req.File),
		CacheDir:       req.CacheDir,
		CallTimeout:    req.CallTimeout,
		MemoryLimitMiB: req.MemoryLimitMiB,
		MaxOutputBytes: req.MaxOutputBytes,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "keel compile child:", err)
		return 2
	}
	r.ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	r.workers = max(req.Workers, 1)
	var reply childReply
	in, compiled, err := r.inspect(ctx, req.Name, req.File)
	if err != nil {
		reply.Error = err.Error()
		reply.Unusable = errors.Is(err, keel.ErrUnusableTool)
		if u, ok := errors.AsType[*UnsupportedError](err); ok {
			reply.Unsupported = u.Feature
		}
	} else {
		reply.Inspection = &in
		_ = compiled.Close(ctx)
	}
	_ = r.closeRuntime(ctx)
	if err := json.NewEncoder(stdout).Encode(reply); err != nil {
		fmt.Fprintln(os.Stderr, "keel compile child: write reply:", err)
		return 2
	}
	return 0
}

// inspectOutside inspects the tool file in a compile child, or reads
// back what a child found of the same file before.
func (r *Registry) inspectOutside(ctx context.Context, name, file string) (inspection, error) {
	sum, stamp, err := hashTool(file)
	if err != nil {
		return inspection{}, err
	}
	side, err := readSidecar(filepath.Join(filepath.Dir(file), name+".manifest.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		side = nil
	case err != nil:
		return inspection{}, fmt.Errorf("read sidecar manifest: %w", err)
	case side == nil:
		side = []byte{}
	}
	key := r.inspectedFile(name, sum, side)
	if data, err := os.ReadFile(key); err == nil {
		var in inspection
		if json.Unmarshal(data, &in) == nil && in.SHA256 == sum {
			in.Stamp = stamp
			return in, nil
		}
	}
	in, err := r.runChild(ctx, name, file)
	if err != nil {
		return inspection{}, err
	}
	if in.SHA256 == sum && (in.HasSidecar == (side != nil)) && (side == nil || bytes.Equal(in.Manifest, side)) {
		if data, err := json.Marshal(in); err == nil {
			r.keep(key, data)
		}
	}
	return in, nil
}

// inspectedVersion names the form of the inspections kept in the cache.
const inspectedVersion = "2" // 2: Need

// inspectedFile is where the cache keeps what a child found of the tool
// name with file digest sum and sidecar side (nil: none). The memory
// limit is part of the key because the module check depends on it, and
// wazero's version because its compiled code is kept per version.
func (r *Registry) inspectedFile(name, sum string, side []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\x00", name, GrantDigest(sum, side), r.cfg.MemoryLimitMiB, wazeroVersion())
	return filepath.Join(r.cfg.CacheDir, "inspected", fmt.Sprintf("%x-v%s.json", h.Sum(nil)[:16], inspectedVersion))
}

// wazeroVersion is the version of wazero built into this program, ""
// when unknown (as in tests).
var wazeroVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/tetratelabs/wazero" {
			if d.Replace != nil {
				d = d.Replace
			}
			return d.Version + d.Sum
		}
	}
	return ""
})

// hashTool returns the hex sha256 of a tool file and its stamp, from the
// same open file, without holding the file in memory.
func hashTool(file string) (string, fileStamp, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fileStamp{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fileStamp{}, err
	}
	if !fi.Mode().IsRegular() {
		return "", fileStamp{}, fmt.Errorf("%s is not a regular file", file)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fileStamp{}, err
	}
	return hex.EncodeToString(h.Sum(nil)), stampOf(fi), nil
}

// runChild runs one compile child for the tool file, one child at a time
// per registry, and returns what it found. It kills the child when ctx
// ends, after Compiler.Timeout, or when its memory passes
// Compiler.MemoryLimitMiB.
func (r *Registry) runChild(ctx context.Context, name, file string) (inspection, error) {
	c := r.cfg.Compiler
	select {
	case r.childSlot <- struct{}{}:
	case <-ctx.Done():
		return inspection{}, &CompileError{Tool: name, Err: ctx.Err(), Detail: "stopped while waiting for another compile"}
	}
	defer func() { <-r.childSlot }()
	if r.cfg.testHookChild != nil {
		r.cfg.testHookChild(name)
	}

	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultCompileTimeout
	}
	limit := int64(c.MemoryLimitMiB) << 20
	if limit <= 0 {
		limit = DefaultCompileMemoryLimitMiB << 20
	}
	soft := c.SoftLimitMiB
	if soft == 0 {
		soft = DefaultCompileSoftLimitMiB
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return inspection{}, err
	}
	req, err := json.Marshal(childRequest{
		Name: name, File: abs, CacheDir: r.cfg.CacheDir,
		CallTimeout: r.cfg.CallTimeout, MemoryLimitMiB: r.cfg.MemoryLimitMiB,
		MaxOutputBytes: r.cfg.MaxOutputBytes, SoftLimitMiB: soft,
		Workers: max(c.Workers, 1),
	})
	if err != nil {
		return inspection{}, err
	}

	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, c.Path, c.Args...)
	cmd.Env = append(append(os.Environ(), c.Env...), compileChildEnv+"=1")
	cmd.SysProcAttr = childAttr()
	cmd.Stdin = bytes.NewReader(req)
	stdout := &limitedWriter{limit: maxReplyBytes}
	stderr := &limitedWriter{limit: stderrLimit}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 5 * time.Second // a grandchild holding the pipes does not hold us
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return inspection{}, fmt.Errorf("start the compile process: %w", err)
	}
	watch := newMemoryWatch(cmd.Process, limit)
	err = cmd.Wait()
	oom := watch.stop()
	peak := maxRSS(cmd.ProcessState)
	r.log.Info("wasmtools: compile process ended", logkey.Tool, name, logkey.Duration, time.Since(start), logkey.PeakRSSKiB, peak>>10)

	fail := func(sentinel error) (inspection, error) {
		detail := "no reply"
		if cmd.ProcessState != nil {
			detail = cmd.ProcessState.String()
		}
		if peak > 0 {
			detail += ", peak memory " + strconv.FormatInt(peak>>20, 10) + " MiB"
		}
		if s := bytes.TrimSpace(stderr.buf.Bytes()); len(s) > 0 {
			detail += "; stderr: " + head(s, 512)
		}
		return inspection{}, &CompileError{Tool: name, Err: sentinel, Detail: detail}
	}
	switch {
	case oom:
		return fail(ErrCompileOutOfMemory)
	case ctx.Err() != nil:
		return fail(ctx.Err())
	case runCtx.Err() != nil:
		return fail(ErrCompileTimeout)
	case err != nil:
		return fail(ErrCompileCrashed)
	}
	var reply childReply
	if err := json.Unmarshal(stdout.buf.Bytes(), &reply); err != nil || (reply.Inspection == nil) == (reply.Error == "") {
		return fail(ErrCompileCrashed)
	}
	if reply.Error != "" {
		e := &childError{msg: reply.Error, unusable: reply.Unusable}
		if reply.Unsupported != "" {
			e.unsupported = &UnsupportedError{Feature: reply.Unsupported}
		}
		return inspection{}, e
	}
	return *reply.Inspection, nil
}

// head returns the start of s, at most n bytes, for an error message:
// where a Go program says why it died.
func head(s []byte, n int) string {
	if len(s) > n {
		s = s[:n]
		if i := bytes.LastIndexByte(s, '\n'); i > 0 {
			s = s[:i]
		}
	}
	return string(s)
}

// maxReplyBytes bounds what is read of a compile child's reply: a
// manifest (at most maxManifestBytes) in base64 and a little more.
const maxReplyBytes = 2*maxManifestBytes + 64<<10
