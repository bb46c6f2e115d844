package models_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// TestPromptHashes: the template hash follows the system prompt only,
// the full hash everything the model is sent.
func TestPromptHashes(t *testing.T) {
	base := models.ChatRequest{Model: "m", Messages: []models.Message{
		{Role: models.RoleSystem, Content: "You are an agent."},
		{Role: models.RoleUser, Content: "count the words"},
	}}
	tmpl, full := models.PromptHashes(base)
	if len(tmpl) != 16 || len(full) != 16 {
		t.Fatalf("PromptHashes = %q, %q; want 16 hex digits each", tmpl, full)
	}
	with := func(f func(r *models.ChatRequest)) models.ChatRequest {
		r := base
		r.Messages = append([]models.Message(nil), base.Messages...)
		f(&r)
		return r
	}
	for _, tt := range []struct {
		name         string
		req          models.ChatRequest
		sameTemplate bool
		sameFull     bool
	}{
		{"same request", with(func(r *models.ChatRequest) {}), true, true},
		{"another model", with(func(r *models.ChatRequest) { r.Model = "other" }), true, true},
		{"another goal", with(func(r *models.ChatRequest) { r.Messages[1].Content = "count the lines" }), true, false},
		{"one more message", with(func(r *models.ChatRequest) {
			r.Messages = append(r.Messages, models.Message{Role: models.RoleAssistant, Content: "3"})
		}), true, false},
		{"tools offered", with(func(r *models.ChatRequest) {
			r.Tools = []keel.ToolSpec{{Name: "wordcount", InputSchema: json.RawMessage(`{}`)}}
		}), true, false},
		{"an output schema", with(func(r *models.ChatRequest) { r.Format = json.RawMessage(`{"type":"object"}`) }), true, false},
		{"another system prompt", with(func(r *models.ChatRequest) { r.Messages[0].Content = "You are a planner." }), false, false},
	} {
		gt, gf := models.PromptHashes(tt.req)
		if (gt == tmpl) != tt.sameTemplate || (gf == full) != tt.sameFull {
			t.Errorf("%s: PromptHashes = %q, %q; base %q, %q; want same template %v, same prompt %v", tt.name, gt, gf, tmpl, full, tt.sameTemplate, tt.sameFull)
		}
	}
	if gt, _ := models.PromptHashes(models.ChatRequest{Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}); gt != "" {
		t.Errorf("template hash of a request without a system prompt = %q, want none", gt)
	}
}

// BenchmarkPromptHashes hashes the context of an agent run's 50th step
// (100 messages), which every model call of a run's trace does.
func BenchmarkPromptHashes(b *testing.B) {
	req := models.ChatRequest{Messages: []models.Message{{Role: models.RoleSystem, Content: "You are an agent running inside keel."}, {Role: models.RoleUser, Content: "count to fifty"}}}
	for i := range 50 {
		id := "call_" + strconv.Itoa(i)
		req.Messages = append(req.Messages, models.Message{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: id, Name: "next", Arguments: json.RawMessage(`{"n":1}`)}}},
			models.Message{Role: models.RoleTool, ToolCallID: id, ToolName: "next", Content: `{"n":2}`})
	}
	req.Tools = []keel.ToolSpec{{Name: "next", Description: "next number", InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)}}
	b.ReportAllocs()
	for b.Loop() {
		models.PromptHashes(req)
	}
}

// TestPromptHasher: hashing a growing conversation step by step gives
// what PromptHashes gives for each request, also when an earlier
// message changed (a summary replaced older steps) or was changed in a
// copy.
func TestPromptHasher(t *testing.T) {
	var h models.PromptHasher
	msgs := []models.Message{{Role: models.RoleSystem, Content: "You are an agent."}, {Role: models.RoleUser, Content: "goal"}}
	check := func(name string, req models.ChatRequest) {
		t.Helper()
		gt, gf := h.Hashes(req)
		wt, wf := models.PromptHashes(req)
		if gt != wt || gf != wf {
			t.Errorf("%s: PromptHasher.Hashes = %q, %q; PromptHashes = %q, %q", name, gt, gf, wt, wf)
		}
	}
	tools := []keel.ToolSpec{{Name: "echo", InputSchema: json.RawMessage(`{}`)}}
	for i := range 5 {
		check("step "+strconv.Itoa(i), models.ChatRequest{Messages: msgs, Tools: tools})
		msgs = append(msgs, models.Message{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: "c" + strconv.Itoa(i), Name: "echo", Arguments: json.RawMessage(`{"n":1}`)}}},
			models.Message{Role: models.RoleTool, ToolCallID: "c" + strconv.Itoa(i), Content: "ok"})
	}
	summarized := append([]models.Message{msgs[0], {Role: models.RoleUser, Content: "summary"}}, msgs[6:]...)
	check("summarized", models.ChatRequest{Messages: summarized, Tools: tools})
	edited := slices.Clone(summarized)
	edited[2].ToolCalls = []keel.ToolCall{{ID: edited[2].ToolCalls[0].ID, Name: "echo", Arguments: json.RawMessage(`{"n":2}`)}}
	check("an argument edited in a copy", models.ChatRequest{Messages: edited, Tools: tools})
	check("shorter", models.ChatRequest{Messages: msgs[:2]})
}

// BenchmarkPromptHasher hashes the 50 model calls of a run of 50
// steps, each sent the conversation so far: a run's whole cost.
func BenchmarkPromptHasher(b *testing.B) {
	msgs := []models.Message{{Role: models.RoleSystem, Content: "You are an agent running inside keel."}, {Role: models.RoleUser, Content: "count to fifty"}}
	for i := range 50 {
		id := "call_" + strconv.Itoa(i)
		msgs = append(msgs, models.Message{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: id, Name: "next", Arguments: json.RawMessage(`{"n":1}`)}}},
			models.Message{Role: models.RoleTool, ToolCallID: id, ToolName: "next", Content: `{"n":2}`})
	}
	b.ReportAllocs()
	for b.Loop() {
		var h models.PromptHasher
		for step := range 50 {
			h.Hashes(models.ChatRequest{Messages: msgs[:2+2*step]})
		}
	}
}
