// Package mcpfile is mcp.json, the data directory's declaration of the MCP
// servers keel uses as tool sources (package mcpclient), with the names
// their tools get. It is shared by the daemon and the command line (keel
// mcp add, list, remove, grant), and does no I/O but reading and writing
// the file.
package mcpfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/internal/jsonfile"
)

// FileName is the file of the data directory that declares the MCP
// servers keel uses (see File).
const FileName = "mcp.json"

// File is mcp.json: the MCP servers the user declared, by name. The
// daemon reads it at start and again whenever it changes; `keel mcp
// add` and `keel mcp remove` write it. A missing file declares none.
type File struct {
	Servers map[string]ServerConfig `json:"servers"`
}

// ServerConfig declares one MCP server: URL for streamable HTTP, or
// Command for stdio (exactly one of them).
type ServerConfig struct {
	// URL is a streamable HTTP endpoint (http or https).
	URL string `json:"url,omitempty"`
	// Headers are sent with every HTTP request (Authorization, ...).
	// They are never shown by env.describe or `keel mcp list`.
	Headers map[string]string `json:"headers,omitempty"`
	// Command is the program and arguments of a stdio server: a native
	// process, outside keel's sandbox, run only with NativeGrant.
	Command []string `json:"command,omitempty"`
	// Env is added to the environment a stdio server inherits.
	Env map[string]string `json:"env,omitempty"`
	// Labels are carried by every result of the server's tools (policy
	// labels: private, secret, pii or names of one's own).
	Labels []string `json:"labels,omitempty"`
	// TimeoutSeconds bounds each call of the server's tools; default 60.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// NativeGrant is the user's grant to run Command as a native process:
	// NativeDigest of the command and environment it was given for. A
	// stdio server without it, or whose command or environment changed
	// since, is not started.
	NativeGrant string `json:"native_grant,omitempty"`
}

// Transports of a server.
const (
	TransportHTTP  = "http"
	TransportStdio = "stdio"
)

// Transport is TransportHTTP or TransportStdio.
func (c ServerConfig) Transport() string {
	if len(c.Command) > 0 {
		return TransportStdio
	}
	return TransportHTTP
}

// NativeDigest is what a stdio server's grant is bound to: the SHA-256
// of its command and environment. Any change to either needs a new grant.
func NativeDigest(c ServerConfig) string {
	b, _ := json.Marshal(struct {
		Command []string          `json:"command"`
		Env     map[string]string `json:"env,omitempty"`
	}{c.Command, c.Env})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Granted reports whether the server may run: an HTTP server always (its
// calls are decided by the policy as egress), a stdio server only with a
// native grant bound to its command and environment as they are.
func (c ServerConfig) Granted() bool {
	return c.Transport() == TransportHTTP || c.NativeGrant == NativeDigest(c)
}

// namePattern is what a server's name must match: it is part of its
// tools' names (ToolName), so it is short, plain and has no '-'.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// CheckName fails (wrapping keel.ErrInvalid) unless name can name a
// server.
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("MCP server name %q: want lower-case letters, digits and _, starting with a letter, at most 32: %w", name, keel.ErrInvalid)
	}
	return nil
}

// Check fails, wrapping keel.ErrInvalid, when c cannot declare a server
// named name.
func (c ServerConfig) Check(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	switch {
	case c.URL != "" && len(c.Command) > 0:
		return fmt.Errorf("MCP server %s: give a url (streamable HTTP) or a command (stdio), not both: %w", name, keel.ErrInvalid)
	case c.URL == "" && len(c.Command) == 0:
		return fmt.Errorf("MCP server %s: give a url (streamable HTTP) or a command (stdio): %w", name, keel.ErrInvalid)
	case c.URL != "":
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("MCP server %s: url %q: want an http or https URL: %w", name, c.URL, keel.ErrInvalid)
		}
		if len(c.Env) > 0 || c.NativeGrant != "" {
			return fmt.Errorf("MCP server %s: env and native_grant are for stdio servers: %w", name, keel.ErrInvalid)
		}
	default:
		if c.Command[0] == "" {
			return fmt.Errorf("MCP server %s: the command is empty: %w", name, keel.ErrInvalid)
		}
		if len(c.Headers) > 0 {
			return fmt.Errorf("MCP server %s: headers are for HTTP servers: %w", name, keel.ErrInvalid)
		}
	}
	for k := range c.Headers {
		if k == "" || strings.ContainsAny(k, " :\r\n") {
			return fmt.Errorf("MCP server %s: header name %q: %w", name, k, keel.ErrInvalid)
		}
	}
	for k := range c.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("MCP server %s: environment variable name %q: %w", name, k, keel.ErrInvalid)
		}
	}
	if _, err := keel.NormalizeLabels(c.Labels); err != nil {
		return fmt.Errorf("MCP server %s: labels: %w", name, err)
	}
	if c.TimeoutSeconds < 0 {
		return fmt.Errorf("MCP server %s: timeout_seconds must not be negative: %w", name, keel.ErrInvalid)
	}
	return nil
}

// ReadFile reads and checks the servers of path (mcp.json). A missing
// file declares none; unknown fields and invalid servers are errors
// naming the file.
func ReadFile(path string) (File, error) {
	f, err := jsonfile.Read[File](path, "docs/bridges.md")
	if err != nil {
		return File{}, err
	}
	for _, name := range slices.Sorted(maps.Keys(f.Servers)) {
		if err := f.Servers[name].Check(name); err != nil {
			return File{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return f, nil
}

// WriteFile writes f to path atomically (readable by its owner only:
// headers may hold credentials).
func WriteFile(path string, f File) error {
	if f.Servers == nil {
		f.Servers = map[string]ServerConfig{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, bytes.NewReader(append(b, '\n')), 0o600)
}

// ToolPrefix starts the name of every tool of an MCP server. Installed
// (WebAssembly) tools are named with lower-case letters, digits and _
// only, so no name with a '-' is ever theirs.
const ToolPrefix = "mcp-"

// ToolName is the name under which runs, tools.list and the audit trail
// know the tool remote of server: "mcp-SERVER-TOOL", with every
// character of the tool's name outside [A-Za-z0-9_-] replaced by '_'.
// Models' function names allow only those characters (at most 64; ok is
// false for a longer name), which is why the name is not
// "mcp:SERVER/TOOL", its provenance (Provenance).
func ToolName(server, remote string) (name string, ok bool) {
	var b strings.Builder
	b.WriteString(ToolPrefix + server + "-")
	for _, r := range remote {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name = b.String()
	return name, remote != "" && len(name) <= 64
}

// Provenance is where the tool remote of server comes from, as tools.list
// shows it: "mcp:SERVER/TOOL".
func Provenance(server, remote string) string { return "mcp:" + server + "/" + remote }

// IsToolName reports whether name is the name of an MCP server's tool
// (it starts with ToolPrefix), and the server's name.
func IsToolName(name string) (server string, ok bool) {
	rest, ok := strings.CutPrefix(name, ToolPrefix)
	if !ok {
		return "", false
	}
	server, _, ok = strings.Cut(rest, "-")
	return server, ok && server != ""
}

// ErrNotGranted is wrapped by the state error of a stdio server that has
// no native grant for its command and environment as they are.
var ErrNotGranted = errors.New("no native grant: a stdio MCP server runs as a native process outside the sandbox and needs `keel mcp grant`")
