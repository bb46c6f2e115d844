package wasmtools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/schema"
)

// namePattern is what a tool name must match. Names are also file names
// and identifiers models call, so they stay short and plain.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Manifest isolation values; "" means pooled.
const (
	isolationPooled = "pooled"
	isolationFresh  = "fresh"
)

// maxManifestBytes bounds a manifest, sidecar or printed.
const maxManifestBytes = 1 << 20

// manifest is what a tool declares about itself; see the package
// documentation for the convention.
type manifest struct {
	Name         string              `json:"name"`
	Version      string              `json:"version"`
	Description  string              `json:"description"`
	InputSchema  json.RawMessage     `json:"input_schema"`
	OutputSchema json.RawMessage     `json:"output_schema"`
	SideEffects  keel.SideEffect     `json:"side_effects"`
	Requests     capabilities.Grants `json:"requests"`
	Isolation    string              `json:"isolation"` // "" (pooled) or "fresh"
	// Labels are the labels the tool declares its output carries,
	// whatever it reads (data from a private service, say).
	Labels []string `json:"labels"`
}

// parsedManifest is a validated manifest with its schemas compiled.
type parsedManifest struct {
	manifest
	input  *schema.Schema
	output *schema.Schema // nil when the tool declares no output schema
}

// parseManifest decodes and validates a manifest. Unknown fields are
// errors, so a misspelt field is caught rather than silently ignored.
func parseManifest(data []byte) (*parsedManifest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest is not a valid JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("manifest has data after its JSON object")
	}
	if !namePattern.MatchString(m.Name) {
		return nil, fmt.Errorf("manifest name %q must match %s", m.Name, namePattern)
	}
	if strings.TrimSpace(m.Description) == "" {
		return nil, errors.New("manifest description is required")
	}
	switch m.SideEffects {
	case keel.SideEffectReadOnly, keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite, keel.SideEffectExternal:
	case "":
		return nil, errors.New("manifest side_effects is required")
	default:
		return nil, fmt.Errorf("manifest side_effects %q is not one of read_only, idempotent_write, non_idempotent_write, external", m.SideEffects)
	}
	switch m.Isolation {
	case "", isolationPooled, isolationFresh:
	default:
		return nil, fmt.Errorf("manifest isolation %q is not one of pooled, fresh", m.Isolation)
	}
	if err := checkRequests(m.Requests); err != nil {
		return nil, err
	}
	labels, err := keel.NormalizeLabels(m.Labels)
	if err != nil {
		return nil, fmt.Errorf("manifest labels: %w", err)
	}
	m.Labels = labels
	p := &parsedManifest{manifest: m}
	if len(m.InputSchema) == 0 || string(m.InputSchema) == "null" {
		return nil, errors.New("manifest input_schema is required")
	}
	if p.input, err = schema.Compile("tools/"+m.Name+"/input_schema", "input_schema", m.InputSchema); err != nil {
		return nil, fmt.Errorf("manifest %w", err)
	}
	if len(m.OutputSchema) != 0 && string(m.OutputSchema) != "null" {
		if p.output, err = schema.Compile("tools/"+m.Name+"/output_schema", "output_schema", m.OutputSchema); err != nil {
			return nil, fmt.Errorf("manifest %w", err)
		}
	} else {
		p.OutputSchema = nil
	}
	p.InputSchema = compact(m.InputSchema)
	p.OutputSchema = compact(p.OutputSchema)
	return p, nil
}

func checkRequests(r capabilities.Grants) error {
	if err := r.Limits.Check(); err != nil {
		return fmt.Errorf("manifest requests.%w", err)
	}
	seen := map[string]bool{}
	for _, fs := range r.FS {
		switch {
		case fs.HostPath != "":
			return fmt.Errorf("manifest requests.fs %q: a tool cannot name a host_path; the host decides what to mount", fs.GuestPath)
		case !path.IsAbs(fs.GuestPath) || path.Clean(fs.GuestPath) != fs.GuestPath:
			return fmt.Errorf("manifest requests.fs guest_path %q must be an absolute, clean path such as /workspace", fs.GuestPath)
		case seen[fs.GuestPath]:
			return fmt.Errorf("manifest requests.fs guest_path %q is requested twice", fs.GuestPath)
		case len(fs.Labels) > 0:
			return fmt.Errorf("manifest requests.fs %q: a tool cannot label a directory; the user labels grants, and a tool declares its output's labels in the top-level labels", fs.GuestPath)
		}
		seen[fs.GuestPath] = true
	}
	for _, n := range r.Network {
		if strings.TrimSpace(n) == "" {
			return errors.New("manifest requests.network has an empty entry")
		}
	}
	for _, e := range r.Env {
		if e == "" || strings.ContainsAny(e, "=\x00") {
			return fmt.Errorf("manifest requests.env %q is not a valid environment variable name", e)
		}
	}
	return nil
}

// compact returns raw without insignificant space; raw must be valid JSON.
func compact(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// missingGrant names the first request that g does not meet, or returns
// "" when every request is granted. A read-write request needs a writable
// grant; a read-only request is met by either.
func missingGrant(req, g capabilities.Grants) string {
	for _, fs := range req.FS {
		allowed, writable := g.GuestPathAllowed(fs.GuestPath)
		switch {
		case !allowed:
			return fmt.Sprintf("filesystem %s (%s)", fs.GuestPath, access(fs.ReadOnly))
		case !fs.ReadOnly && !writable:
			return fmt.Sprintf("filesystem %s (read-write; only read-only is granted)", fs.GuestPath)
		}
	}
	// Network requests are patterns; they are met once the user granted at
	// least one destination they cover. Each request the tool makes is
	// then checked against the grants when it is made (see netcap.go).
	covered := func(gr string) bool {
		return slices.ContainsFunc(req.Network, func(n string) bool { return capabilities.PatternCovers(n, gr) })
	}
	if len(req.Network) > 0 && !slices.ContainsFunc(g.Network, covered) {
		return "network access to " + strings.Join(req.Network, " or ")
	}
	for _, e := range req.Env {
		if !slices.Contains(g.Env, e) {
			return "environment variable " + e
		}
	}
	return ""
}

func access(readOnly bool) string {
	if readOnly {
		return "read-only"
	}
	return "read-write"
}
