package wasmtools

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// What a call reached (keel.ToolInvocation.Touched). A call that asks
// for it gets a callTouch; the granted directories record the host paths
// the guest opens into it, and the network host function the hosts it
// sends requests to. A call that does not ask records nothing and pays
// nothing but a nil check per open and per request.
//
// Instances outlive calls (a pooled reactor serves call after call), and
// their mounts are made once per instance, so the mounts cannot hold the
// call's recorder: they share the instance's fsUse, which the call using
// the instance points at its recorder for the time the guest runs (see
// invoke and run) and clears before the instance goes back to the pool.

// callTouch records what one call reached. Its methods may be called
// from the call's host functions (on the call's goroutine) and are safe
// for concurrent use.
type callTouch struct {
	mu        sync.Mutex
	paths     []string
	seen      map[string]struct{}
	truncated bool
	hosts     []string
	refused   []keel.EgressRefusal
}

// refusedBy records a request the policy refused.
func (c *callTouch) refusedBy(r keel.EgressRefusal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refused = append(c.refused, r)
}

// opened records the host path p of a file or directory the call opened.
func (c *callTouch) opened(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[p]; ok {
		return
	}
	if len(c.paths) >= keel.MaxTouchedPaths {
		c.truncated = true
		return
	}
	if c.seen == nil {
		c.seen = map[string]struct{}{}
	}
	c.seen[p] = struct{}{}
	c.paths = append(c.paths, p)
}

// reached records a network destination the call sent a request to, or
// tried to, as host:port.
func (c *callTouch) reached(d capabilities.Destination) {
	hp := net.JoinHostPort(d.Host, strconv.Itoa(d.Port))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.hosts {
		if h == hp {
			return
		}
	}
	c.hosts = append(c.hosts, hp)
}

// fill writes what the call reached to dst, with labels: those of the
// grants the instance opened files through (use, nil for none) and
// those the tool's manifest declares.
func (c *callTouch) fill(dst *keel.Touched, use *fsUse, declared []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*dst = keel.Touched{Paths: c.paths, Truncated: c.truncated, Hosts: c.hosts, Labels: keel.UnionLabels(declared, use.labels()), Refused: c.refused}
}

// fsUse is shared by the mounts of one instance. call is the recorder of
// the call running on the instance, nil when it records nothing or no
// call runs; opened[i] is set once a file was opened through the
// instance's mount i, and grantLabels[i] are that mount's grant's
// labels.
//
// An instance serves one call at a time, its guest opens files on the
// goroutine running that call, and the pool hands it from call to call
// under a lock (as diskMeter relies on), so no lock is needed here.
//
// opened is kept for the instance's life, not per call, and counts what
// its initialization opened too: a pooled instance keeps what it read in
// its memory, and a later call may return it, so every later call
// carries the labels of what the instance ever read. A tool with
// "isolation": "fresh" gets the labels of its own call only.
type fsUse struct {
	call        *callTouch
	opened      []bool
	grantLabels [][]string
}

func newFSUse(mounts []mount) *fsUse {
	u := &fsUse{opened: make([]bool, len(mounts)), grantLabels: make([][]string, len(mounts))}
	for i, m := range mounts {
		u.grantLabels[i] = m.labels
	}
	return u
}

// labels returns the labels of the mounts files were opened through.
func (u *fsUse) labels() []string {
	if u == nil {
		return nil
	}
	var out []string
	for i, ok := range u.opened {
		if ok {
			out = append(out, u.grantLabels[i]...)
		}
	}
	return keel.UnionLabels(out, nil)
}

// begin points the instance's mounts at the recorder of the call about
// to run on it (nil: record nothing); end clears it. Both do nothing on
// a nil fsUse (an instance without mounts).
func (u *fsUse) begin(c *callTouch) {
	if u != nil {
		u.call = c
	}
}

func (u *fsUse) end() {
	if u != nil {
		u.call = nil
	}
}

// mountUse is what one mount of an instance records through: the
// instance's fsUse, the mount's index in it, and the grant's host
// directory with its symbolic links resolved (mount.real).
type mountUse struct {
	use  *fsUse
	idx  int
	real string
}

// opened records that the guest opened name (a path beneath the mount,
// as rootName returns it).
//
// The mount's root itself, ".", is recorded when the guest lists it
// (rootFile.Readdir), not when it is opened: wazero opens each mount's
// root itself, once per instance, to answer the guest runtime's question
// which directories it was given (fd_prestat_get), which reads nothing.
func (m *mountUse) opened(name string) {
	if m == nil {
		return
	}
	m.use.opened[m.idx] = true
	if c := m.use.call; c != nil {
		c.opened(m.hostPath(name))
	}
}

// hostPath is the host path of name with every symbolic link resolved
// as os.Root resolved it when it opened the file: beneath the grant's
// host directory, itself resolved when the grant was mounted. A link
// changed since the open, so that the path now resolves outside the
// directory, is recorded as the path beneath the directory, unresolved.
func (m *mountUse) hostPath(name string) string {
	if name == "." {
		return m.real
	}
	lexical := filepath.Join(m.real, filepath.FromSlash(name))
	p, err := filepath.EvalSymlinks(lexical)
	if err != nil || !beneath(m.real, p) {
		return lexical
	}
	return p
}

// beneath reports whether p is dir or beneath it; both are clean.
func beneath(dir, p string) bool {
	if p == dir {
		return true
	}
	if !strings.HasSuffix(dir, string(filepath.Separator)) {
		dir += string(filepath.Separator)
	}
	return strings.HasPrefix(p, dir)
}
