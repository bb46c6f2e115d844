package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// writeTelemetry writes the data dir's telemetry.json.
func writeTelemetry(t *testing.T, dir string, cfg map[string]any) {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, daemon.TelemetryConfigFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// jaegerTrace is a trace as Jaeger's query API returns it.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		TraceID       string `json:"traceID"`
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
}

// jaegerTraces polls Jaeger's query API for the traces of service until
// ok holds of them, or fails after a minute.
func jaegerTraces(t *testing.T, query, service string, ok func([]jaegerTrace) bool) []jaegerTrace {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last []jaegerTrace
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = getTraces(query, service)
		if lastErr == nil && ok(last) {
			return last
		}
		time.Sleep(200 * time.Millisecond) // a poll interval: Jaeger offers nothing to wait on
	}
	t.Fatalf("Jaeger has no traces of %s as expected within a minute (last error %v): %+v", service, lastErr, last)
	return nil
}

func getTraces(query, service string) ([]jaegerTrace, error) {
	resp, err := http.Get(query + "/api/traces?limit=100&service=" + url.QueryEscape(service))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	return body.Data, json.NewDecoder(resp.Body).Decode(&body)
}

// tags returns a span's tags as strings.
func tagsOf(sp any) map[string]string {
	b, _ := json.Marshal(sp)
	var s struct {
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	}
	json.Unmarshal(b, &s)
	m := map[string]string{}
	for _, tg := range s.Tags {
		m[tg.Key] = fmt.Sprint(tg.Value)
	}
	return m
}

// traceOfRun returns the trace among traces whose root span is run id's.
func traceOfRun(traces []jaegerTrace, id keel.RunID) (jaegerTrace, bool) {
	for _, tr := range traces {
		for _, sp := range tr.Spans {
			if tg := tagsOf(sp); tg["keel.run.id"] == string(id) && tg["keel.span.kind"] == "run" {
				return tr, true
			}
		}
	}
	return jaegerTrace{}, false
}

// TestExportToJaeger exports runs to a real Jaeger, over gRPC and over
// HTTP, and finds them through its query API: a run whose tool call
// waited for a person's approval has its model call, the wait and the
// tool call under their step, under the run's root, with the GenAI
// attributes and keel's; content was opted in, and is there. A private
// run's trace carries no content. A run in a workspace whose policy
// denies the export is not sent, and the denial is counted. GET /metrics
// needs the token, and shows the run's tokens.
func TestExportToJaeger(t *testing.T) {
	t.Parallel()
	query := os.Getenv("KEEL_TEST_JAEGER_QUERY")
	if query == "" || os.Getenv("KEEL_TEST_OTLP_GRPC") == "" || os.Getenv("KEEL_TEST_OTLP_HTTP") == "" {
		t.Skip("no Jaeger: eval \"$(../shared/jaeger/start)\" sets KEEL_TEST_OTLP_GRPC, KEEL_TEST_OTLP_HTTP and KEEL_TEST_JAEGER_QUERY")
	}
	for _, proto := range []string{"grpc", "http"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			service := fmt.Sprintf("keel-test-%s-%d", proto, time.Now().UnixNano())
			dir := withTools(t, "wordcount")
			cfg := map[string]any{"protocol": proto, "service_name": service, "flush_interval_ms": 100, "content": true}
			if proto == "grpc" {
				cfg["endpoint"], cfg["insecure"] = os.Getenv("KEEL_TEST_OTLP_GRPC"), true
			} else {
				cfg["endpoint"] = os.Getenv("KEEL_TEST_OTLP_HTTP")
			}
			writeTelemetry(t, dir, cfg)
			denyWS := t.TempDir()
			if err := os.MkdirAll(filepath.Dir(policy.WorkspacePath(denyWS)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(policy.WorkspacePath(denyWS), []byte(`{"rules": [{"action": "telemetry", "host": "127.0.0.1", "decision": "deny", "reason": "this project's traces stay here"}]}`), 0o600); err != nil {
				t.Fatal(err)
			}
			p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
				if goal == "count" {
					return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"one two three"}`)}), scripted.Answer("counted three")}
				}
				return []scripted.Step{scripted.Answer("the answer is swordfish")}
			})
			d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p, RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly},
				ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json")})
			c := dial(t, d.dir)
			ctx := context.Background()

			run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count"})
			if err != nil {
				t.Fatal(err)
			}
			ev := waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
			var req keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &req); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ApproveRun(ctx, protocol.RunApproveParams{RunID: run.ID, CallID: "c1", ArgsSHA256: req.ArgsSHA256, Approved: true}); err != nil {
				t.Fatal(err)
			}
			if evs := follow(t, c, run.ID); evs[len(evs)-1].Type != keel.EventRunSucceeded {
				t.Fatalf("run ended with %s", evs[len(evs)-1].Type)
			}
			private := runToEnd(t, c, protocol.RunStartParams{Goal: "tell the secret", Policy: keel.RunPolicy{Private: true}})
			denied := runToEnd(t, c, protocol.RunStartParams{Goal: "in the project", Workspace: denyWS})
			if private.Run.Status != keel.RunSucceeded || denied.Run.Status != keel.RunSucceeded {
				t.Fatalf("runs ended %s, %s; want succeeded", private.Run.Status, denied.Run.Status)
			}

			traces := jaegerTraces(t, query, service, func(trs []jaegerTrace) bool {
				a, ok1 := traceOfRun(trs, run.ID)
				b, ok2 := traceOfRun(trs, private.Run.ID)
				return ok1 && ok2 && len(a.Spans) == 7 && len(b.Spans) == 3
			})
			tr, _ := traceOfRun(traces, run.ID)
			byID := map[string]string{}
			for _, sp := range tr.Spans {
				byID[sp.SpanID] = sp.OperationName
				if sp.TraceID != tr.TraceID {
					t.Errorf("span %s in trace %s, want %s", sp.OperationName, sp.TraceID, tr.TraceID)
				}
			}
			var shape []string
			spans := map[string]map[string]string{}
			for _, sp := range tr.Spans {
				parent := "-"
				for _, ref := range sp.References {
					if ref.RefType == "CHILD_OF" {
						parent = byID[ref.SpanID]
					}
				}
				shape = append(shape, sp.OperationName+" < "+parent)
				spans[sp.OperationName+" < "+parent] = tagsOf(sp)
			}
			slices.Sort(shape)
			want := []string{"chat scripted < step 1", "chat scripted < step 2", "execute_tool wordcount < step 1", "human.wait approve wordcount < step 1",
				"invoke_agent agent < -", "step 1 < invoke_agent agent", "step 2 < invoke_agent agent"}
			if !slices.Equal(shape, want) {
				t.Fatalf("trace in Jaeger:\n%s\nwant\n%s", strings.Join(shape, "\n"), strings.Join(want, "\n"))
			}
			check := func(span string, want map[string]string) {
				t.Helper()
				for k, v := range want {
					if got, ok := spans[span][k]; !ok || v != "*" && got != v {
						t.Errorf("%s: tag %s = %q, want %q (tags %v)", span, k, got, v, spans[span])
					}
				}
			}
			check("invoke_agent agent < -", map[string]string{"gen_ai.operation.name": "invoke_agent", "keel.run.id": string(run.ID), "keel.run.status": "succeeded",
				"gen_ai.input.messages": "*", "gen_ai.output.messages": "*"})
			check("chat scripted < step 1", map[string]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "*", "gen_ai.request.model": "*",
				"gen_ai.response.model": "scripted", "gen_ai.usage.input_tokens": "*", "gen_ai.usage.output_tokens": "*", "keel.step": "1", "gen_ai.output.messages": "*"})
			check("human.wait approve wordcount < step 1", map[string]string{"keel.human.wait": "true", "gen_ai.tool.call.id": "c1", "keel.policy.outcome": "ask"})
			check("execute_tool wordcount < step 1", map[string]string{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "wordcount",
				"gen_ai.tool.call.id": "c1", "keel.policy.outcome": "ask", "gen_ai.tool.call.arguments": `{"text":"one two three"}`, "gen_ai.tool.call.result": "*"})
			if !strings.Contains(spans["chat scripted < step 2"]["gen_ai.output.messages"], "counted three") {
				t.Errorf("the last chat span's output = %q, want the model's answer", spans["chat scripted < step 2"]["gen_ai.output.messages"])
			}

			// The private run: its trace is there, without a word of what was said.
			ptr, _ := traceOfRun(traces, private.Run.ID)
			for _, sp := range ptr.Spans {
				tg := tagsOf(sp)
				for k, v := range tg {
					if strings.Contains(v, "swordfish") || strings.Contains(v, "tell the secret") || strings.HasPrefix(k, "gen_ai.input") || strings.HasPrefix(k, "gen_ai.output") {
						t.Errorf("private run's span %s exports content: %s = %s", sp.OperationName, k, v)
					}
				}
				if tg["keel.content.omitted"] != "true" || !strings.Contains(tg["keel.labels"], "private") {
					t.Errorf("private run's span %s: tags %v, want keel.content.omitted and the label private", sp.OperationName, tg)
				}
			}
			if _, ok := traceOfRun(traces, denied.Run.ID); ok {
				t.Errorf("the run whose workspace policy denies the export is in Jaeger")
			}
			// The denied run ended last: its spans may be decided a flush
			// after the others reached Jaeger.
			var tel *capabilities.TelemetryState
			for deadline := time.Now().Add(time.Minute); ; {
				env, err := c.Describe(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if tel = env.Telemetry; tel == nil || tel.Denied >= 3 || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond) // a poll interval
			}
			if tel == nil || !tel.Export || tel.Protocol != proto || tel.Exported < 10 || tel.Denied != 3 || tel.Dropped != 0 {
				t.Errorf("env.describe telemetry = %+v, want export over %s, 10 spans exported, the denied run's 3 denied", tel, proto)
			}

			// Metrics: the token is required; with it, the run's tokens.
			token, err := datadir.ReadToken(d.dir, d.info)
			if err != nil {
				t.Fatal(err)
			}
			u, err := url.Parse(d.info.URL)
			if err != nil {
				t.Fatal(err)
			}
			metricsURL := "http://" + u.Host + "/metrics"
			get := func(tok string) (int, string) {
				req, _ := http.NewRequest("GET", metricsURL, nil)
				if tok != "" {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			if code, _ := get(""); code != http.StatusUnauthorized {
				t.Errorf("GET /metrics without the token = %d, want 401", code)
			}
			code, body := get(token)
			if code != http.StatusOK || !strings.Contains(body, `keel_tokens_total{`) || !strings.Contains(body, `keel_runs_ended_total{keel_run_status="succeeded"} 3`) ||
				!strings.Contains(body, `keel_tool_duration_seconds_count{gen_ai_tool_name="wordcount"} 1`) {
				t.Errorf("GET /metrics = %d:\n%s", code, body)
			}
		})
	}
}

// TestExportCollectorDown: telemetry.json names a collector that is not
// there (a closed port). Runs finish as they would without export; the
// spans that could not be sent are counted, and keel doctor shows it.
func TestExportCollectorDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, proto := range []string{"grpc", "http"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			dir := noTools(t)
			endpoint := closed
			if proto == "http" {
				endpoint = "http://" + closed
			}
			writeTelemetry(t, dir, map[string]any{"endpoint": endpoint, "protocol": proto, "insecure": proto == "grpc", "flush_interval_ms": 50, "export_timeout_ms": 2000})
			d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil, scripted.Repeat(scripted.Answer("done"))),
				ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json")})
			c := dial(t, d.dir)
			ctx := context.Background()
			for range 3 {
				if got := runToEnd(t, c, protocol.RunStartParams{Goal: "go"}); got.Run.Status != keel.RunSucceeded || got.Run.Result != "done" {
					t.Fatalf("run with the collector down: %s %q, want succeeded", got.Run.Status, got.Run.Result)
				}
			}
			deadline := time.Now().Add(time.Minute)
			for {
				env, err := c.Describe(ctx)
				if err != nil {
					t.Fatal(err)
				}
				tel := env.Telemetry
				if tel != nil && tel.Failed+tel.Dropped == 9 {
					if tel.Exported != 0 || tel.LastError == "" {
						t.Errorf("telemetry = %+v, want nothing exported and the last error", tel)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("telemetry = %+v, want the 9 spans of 3 runs failed or dropped", tel)
				}
				time.Sleep(50 * time.Millisecond) // a poll interval
			}
			out, errOut, code := runCLI(ctx, d.dir, "doctor")
			if code != 0 || !strings.Contains(out, "telemetry     export "+proto) || !strings.Contains(out, "9 failed") || !strings.Contains(out, "FAILING since") {
				t.Errorf("keel doctor = %d:\n%s%s\nwant the export's state: 9 failed, FAILING", code, out, errOut)
			}
		})
	}
}

// TestTelemetryConfigRefused: a telemetry.json with a field the format
// does not have stops the daemon from starting, naming the file and the
// field; without the file, nothing is exported and metrics are served.
func TestTelemetryConfigRefused(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	writeTelemetry(t, dir, map[string]any{"endpoint": "127.0.0.1:4317", "insecure": true, "sample_rate": 0.5})
	err := daemon.Run(context.Background(), daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
		ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, daemon.TelemetryConfigFile)) || !strings.Contains(err.Error(), `"sample_rate"`) {
		t.Fatalf("daemon.Run with an unknown field in telemetry.json = %v, want an error naming the file and the field", err)
	}
	os.Remove(filepath.Join(dir, daemon.TelemetryConfigFile))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	env, err := dial(t, d.dir).Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tel := env.Telemetry; tel == nil || tel.Export || !tel.Metrics {
		t.Errorf("telemetry without telemetry.json = %+v, want export off and metrics on", tel)
	}
}
