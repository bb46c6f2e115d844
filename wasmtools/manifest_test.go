package wasmtools

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

const validManifest = `{
	"name": "readfile",
	"version": "0.1.0",
	"description": "Read a file.",
	"input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
	"output_schema": {"type": "object"},
	"side_effects": "read_only",
	"requests": {"fs": [{"guest_path": "/workspace", "read_only": true}], "network": [], "env": ["HOME"]}
}`

func TestParseManifest(t *testing.T) {
	m, err := parseManifest([]byte(validManifest))
	if err != nil {
		t.Fatalf("parseManifest(valid) error: %v", err)
	}
	if m.Name != "readfile" || m.SideEffects != keel.SideEffectReadOnly || m.input == nil || m.output == nil {
		t.Errorf("parseManifest(valid) = %+v", m.manifest)
	}
	if got, want := string(m.InputSchema), `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`; got != want {
		t.Errorf("InputSchema = %s, want compacted %s", got, want)
	}
	wantReq := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace", ReadOnly: true}}, Network: []string{}, Env: []string{"HOME"}}
	if diff := cmp.Diff(wantReq, m.Requests); diff != "" {
		t.Errorf("Requests mismatch (-want +got):\n%s", diff)
	}

	if m.Labels != nil {
		t.Errorf("Labels = %q, want none", m.Labels)
	}
	labelled, err := parseManifest([]byte(strings.Replace(validManifest, `"side_effects": "read_only",`, `"side_effects": "read_only", "labels": ["secret", "pii", "secret"],`, 1)))
	if err != nil || !cmp.Equal(labelled.Labels, []string{"pii", "secret"}) {
		t.Errorf("parseManifest(labels) = %v, %v; want labels [pii secret]", labelled, err)
	}

	tests := []struct {
		name    string
		edit    func(string) string
		wantErr string
	}{
		{"not JSON", func(string) string { return "{" }, "not a valid JSON object"},
		{"two objects", func(s string) string { return s + "{}" }, "data after"},
		{"unknown field", func(s string) string { return strings.Replace(s, `"version"`, `"verison"`, 1) }, "verison"},
		{"bad name", func(s string) string { return strings.Replace(s, `"readfile"`, `"Read-File"`, 1) }, "must match"},
		{"long name", func(s string) string { return strings.Replace(s, `"readfile"`, `"`+strings.Repeat("a", 65)+`"`, 1) }, "must match"},
		{"no description", func(s string) string { return strings.Replace(s, `"Read a file."`, `"  "`, 1) }, "description"},
		{"no side effects", func(s string) string { return strings.Replace(s, `"side_effects": "read_only",`, ``, 1) }, "side_effects is required"},
		{"unknown side effect", func(s string) string { return strings.Replace(s, `"read_only",`, `"harmless",`, 1) }, "harmless"},
		{"no input schema", func(s string) string {
			return strings.Replace(s, `"input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},`, ``, 1)
		}, "input_schema is required"},
		{"input schema not an object", func(s string) string {
			return strings.Replace(s, `{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}`, `true`, 1)
		}, "must be a JSON Schema object"},
		{"input schema does not compile", func(s string) string { return strings.Replace(s, `"required": ["path"]`, `"required": "path"`, 1) }, "input_schema does not compile"},
		{"output schema does not compile", func(s string) string {
			return strings.Replace(s, `"output_schema": {"type": "object"}`, `"output_schema": {"type": "thing"}`, 1)
		}, "output_schema does not compile"},
		{"schema reads a file", func(s string) string {
			return strings.Replace(s, `"output_schema": {"type": "object"}`, `"output_schema": {"$ref": "file:///etc/passwd"}`, 1)
		}, "output_schema does not compile"},
		{"relative guest path", func(s string) string { return strings.Replace(s, `"/workspace"`, `"workspace"`, 1) }, "absolute"},
		{"unclean guest path", func(s string) string { return strings.Replace(s, `"/workspace"`, `"/workspace/../etc"`, 1) }, "clean"},
		{"host path", func(s string) string { return strings.Replace(s, `"guest_path"`, `"host_path": "/", "guest_path"`, 1) }, "host_path"},
		{"bad env name", func(s string) string { return strings.Replace(s, `"HOME"`, `"A=B"`, 1) }, "environment"},
		{"bad label", func(s string) string {
			return strings.Replace(s, `"side_effects": "read_only",`, `"side_effects": "read_only", "labels": ["pii", "Secret"],`, 1)
		}, "labels"},
		{"labelled request", func(s string) string {
			return strings.Replace(s, `"read_only": true}`, `"read_only": true, "labels": ["pii"]}`, 1)
		}, "cannot label"},
		{"unknown isolation", func(s string) string {
			return strings.Replace(s, `"side_effects": "read_only",`, `"side_effects": "read_only", "isolation": "shared",`, 1)
		}, "isolation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.edit(validManifest)
			if in == validManifest {
				t.Fatal("the edit changed nothing")
			}
			_, err := parseManifest([]byte(in))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseManifest(%s) error = %v, want one mentioning %q", in, err, tt.wantErr)
			}
		})
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(validManifest))
	f.Add([]byte(`{"name":"a","description":"d","input_schema":{},"side_effects":"external"}`))
	f.Add([]byte(`{"name":"a","description":"d","input_schema":{"$ref":"#/$defs/x","$defs":{"x":{"type":"object"}}},"side_effects":"read_only"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			return
		}
		if !namePattern.MatchString(m.Name) || m.input == nil || m.Description == "" {
			t.Errorf("parseManifest(%q) accepted %+v", data, m.manifest)
		}
		if (m.output == nil) != (m.OutputSchema == nil) {
			t.Errorf("parseManifest(%q): output schema %s but compiled %v", data, m.OutputSchema, m.output)
		}
	})
}

func TestMissingGrant(t *testing.T) {
	ro := func(p string) capabilities.FSGrant {
		return capabilities.FSGrant{HostPath: "/h", GuestPath: p, ReadOnly: true}
	}
	rw := func(p string) capabilities.FSGrant { return capabilities.FSGrant{HostPath: "/h", GuestPath: p} }
	req := func(p string, readOnly bool) capabilities.FSGrant {
		return capabilities.FSGrant{GuestPath: p, ReadOnly: readOnly}
	}
	tests := []struct {
		name   string
		req, g capabilities.Grants
		want   string // part of the answer; "" = nothing missing
	}{
		{"nothing asked", capabilities.Grants{}, capabilities.Grants{}, ""},
		{"ro asked, ro given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w", true)}}, capabilities.Grants{FS: []capabilities.FSGrant{ro("/w")}}, ""},
		{"ro asked, rw given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w", true)}}, capabilities.Grants{FS: []capabilities.FSGrant{rw("/w")}}, ""},
		{"ro asked, parent given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w/sub", true)}}, capabilities.Grants{FS: []capabilities.FSGrant{ro("/w")}}, ""},
		{"rw asked, ro given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w", false)}}, capabilities.Grants{FS: []capabilities.FSGrant{ro("/w")}}, "only read-only"},
		{"ro asked, nothing given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w", true)}}, capabilities.Grants{}, "filesystem /w"},
		{"sibling given", capabilities.Grants{FS: []capabilities.FSGrant{req("/w", true)}}, capabilities.Grants{FS: []capabilities.FSGrant{ro("/w2")}}, "filesystem /w"},
		{"env", capabilities.Grants{Env: []string{"TOKEN"}}, capabilities.Grants{Env: []string{"HOME"}}, "environment variable TOKEN"},
		{"network", capabilities.Grants{Network: []string{"https://api.example:443"}}, capabilities.Grants{}, "network access to https://api.example:443"},
		{"network, other host granted", capabilities.Grants{Network: []string{"https://api.example:443"}}, capabilities.Grants{Network: []string{"https://evil.example:443"}}, "network access"},
		{"network wildcard, one host granted", capabilities.Grants{Network: []string{"https://*:443"}}, capabilities.Grants{Network: []string{"https://api.example:443"}}, ""},
	}
	for _, tt := range tests {
		got := missingGrant(tt.req, tt.g)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: missingGrant = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestParseResult(t *testing.T) {
	tests := []struct {
		stdout  string
		output  string
		toolErr string
		bad     bool
	}{
		{`{"output":{"a":1}}`, `{"a":1}`, "", false},
		{"  {\"output\" : [1, 2]}\n", `[1,2]`, "", false},
		{`{"output":null}`, `null`, "", false},
		{`{"output":[1, {"b" :2}]}`, `[1,{"b":2}]`, "", false},
		{`{"output":{"a":1},"output":{"a":2}}`, `{"a":2}`, "", false}, // the last of a repeated key wins, as in encoding/json
		{`{"output":1,"x":2}`, "", "", true},
		{`{"output":01}`, "", "", true},
		{`{"error":{"message":"nope","code":"not_found"}}`, "", "not_found: nope", false},
		{`{"error":{"message":"nope"}}`, "", "nope", false},
		{`{"error":{"message":""}}`, "", "", true},
		{`{"error":"nope"}`, "", "", true},
		{`{"output":1,"error":{"message":"x"}}`, "", "", true},
		{`{}`, "", "", true},
		{`{"result":1}`, "", "", true},
		{`[1]`, "", "", true},
		{``, "", "", true},
		{`{"output":1}{"output":2}`, "", "", true},
		{`{"output":1} trailing`, "", "", true},
		{`{"output":`, "", "", true},
	}
	// A long key of invalid UTF-8 makes goccy/go-json's stream decoder
	// panic; whatever a tool writes, reading it must not.
	tests = append(tests, struct {
		stdout  string
		output  string
		toolErr string
		bad     bool
	}{`{"output":{"k` + strings.Repeat("\xe1", 1500) + `":-1}}`, `{"k` + strings.Repeat("\xe1", 1500) + `":-1}`, "", false})
	known := 0
	for _, tt := range tests {
		// The one-pass reading of a result the toolkit wrote must agree
		// with the full one wherever it answers.
		if out, ok := knownOutput(&tool{}, []byte(tt.stdout)); ok {
			known++
			if tt.bad || tt.toolErr != "" || string(out) != tt.output {
				t.Errorf("knownOutput(%q) = %s; want it left to parseResult, which gives %q (bad %v, tool error %q)", tt.stdout, out, tt.output, tt.bad, tt.toolErr)
			}
		}
		out, te, err := parseResult([]byte(tt.stdout))
		switch {
		case tt.bad:
			if err == nil {
				t.Errorf("parseResult(%q) = %s, %v; want a malformed-result error", tt.stdout, out, te)
			}
		case tt.toolErr != "":
			if err != nil || te == nil || te.Code != keel.ToolFailed || te.Message != tt.toolErr {
				t.Errorf("parseResult(%q) = %v, %v; want tool error %q", tt.stdout, te, err, tt.toolErr)
			}
		default:
			if err != nil || te != nil || string(out) != tt.output {
				t.Errorf("parseResult(%q) = %s, %v, %v; want %s", tt.stdout, out, te, err, tt.output)
			}
		}
	}
	if known != 3 {
		t.Errorf("knownOutput read %d of the results; want the 3 that are in the toolkit's form", known)
	}
}
