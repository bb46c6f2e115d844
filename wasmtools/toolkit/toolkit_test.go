package toolkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var testManifest = Manifest{
	Name:        "echo",
	Description: "Echoes its input.",
	InputSchema: json.RawMessage(`{"type":"object"}`),
	SideEffects: ReadOnly,
}

type echoIn struct {
	Say  string `json:"say"`
	Fail string `json:"fail"`
}

type echoOut struct {
	Said string `json:"said"`
}

func echo(in echoIn) (echoOut, error) {
	switch in.Fail {
	case "coded":
		return echoOut{}, Errorf("not_found", "no %q here", in.Say)
	case "plain":
		return echoOut{}, errors.New("plain failure")
	}
	return echoOut{Said: in.Say}, nil
}

func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		stdin    string
		wantCode int
		want     string // stdout, JSON-compared; "" = empty
	}{
		{"manifest", []string{"echo", "--manifest"}, "", 0,
			`{"name":"echo","description":"Echoes its input.","input_schema":{"type":"object"},"side_effects":"read_only","requests":{}}`},
		{"output", []string{"echo"}, `{"say":"hi"}`, 0, `{"output":{"said":"hi"}}`},
		{"empty input is {}", []string{"echo"}, "", 0, `{"output":{"said":""}}`},
		{"coded error", []string{"echo"}, `{"say":"x","fail":"coded"}`, 0,
			`{"error":{"code":"not_found","message":"no \"x\" here"}}`},
		{"plain error", []string{"echo"}, `{"fail":"plain"}`, 0, `{"error":{"message":"plain failure"}}`},
		{"undecodable input", []string{"echo"}, `{"say":1}`, 0, ""},
		{"bad args", []string{"echo", "--nope"}, "", 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Run(tt.args, strings.NewReader(tt.stdin), &stdout, &stderr, testManifest, Typed(echo))
			if code != tt.wantCode {
				t.Fatalf("Run(%q) = %d, want %d (stderr %q)", tt.args, code, tt.wantCode, stderr.String())
			}
			if tt.name == "undecodable input" {
				var got errorBody
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || got.Error == nil || got.Error.Code != "invalid_input" {
					t.Fatalf("Run(%q) stdout = %q, want an invalid_input error", tt.args, stdout.String())
				}
				return
			}
			if tt.want == "" {
				if stdout.Len() != 0 {
					t.Fatalf("Run(%q) stdout = %q, want nothing", tt.args, stdout.String())
				}
				return
			}
			var got, want any
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("Run(%q) stdout = %q: %v", tt.args, stdout.String(), err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Run(%q) stdout mismatch (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}
