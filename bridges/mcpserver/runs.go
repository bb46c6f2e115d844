package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
)

// Runs is what a Server serves of keel's runs when Config.Runs is set:
// the tool RunStartTool and the resource template TraceTemplate. Both
// are off unless the policy allows them (an implementation's decision;
// the daemon's needs a rule that allows each, see docs/bridges.md).
type Runs interface {
	// StartRun starts a run of req for call (the tools/call of
	// RunStartTool: its client, and Approve for an ask of the policy)
	// and returns its ID. A refusal is a *keel.ToolError.
	StartRun(ctx context.Context, call Call, req keel.StartRequest) (keel.RunID, error)
	// RunSpans returns the trace spans of run id, read for client. An
	// unknown run is keel.ErrNotFound; a refusal, a *keel.ToolError.
	RunSpans(ctx context.Context, id keel.RunID, client string) ([]keel.Span, error)
}

// RunStartTool is the name of the MCP tool that starts a run.
const RunStartTool = "keel_run_start"

// RunTraceTool is the name a read of a run's trace is decided under by
// the daemon's policy, as a call of a tool of that name with the
// arguments {"run_id": ID}. No such tool is served.
const RunTraceTool = "keel_run_trace"

// TraceTemplate is the URI template of a run's trace resource: its spans
// as a tree (SpanTree), JSON.
const TraceTemplate = "keel://runs/{id}/trace"

// runStartTool is RunStartTool as served.
var runStartTool = &sdk.Tool{Name: RunStartTool, Title: "Start a keel run",
	Description: "Start a durable keel run toward goal (with model, or the daemon's default) and return its ID at once; the run goes on in the daemon. Read its trace as the resource keel://runs/{run_id}/trace.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"goal":{"type":"string","minLength":1,"description":"What the run is to achieve."},` +
		`"model":{"type":"string","description":"The model or route (default: the daemon's)."}},"required":["goal"],"additionalProperties":false}`),
	OutputSchema: json.RawMessage(`{"type":"object","properties":{"run_id":{"type":"string"},"trace":{"type":"string"}},"required":["run_id","trace"]}`),
	Annotations:  Annotations(keel.SideEffectExternal, true)}

// addRuns serves cfg.Runs.
func (s *Server) addRuns() {
	runs := s.cfg.Runs
	s.sdk.AddTool(runStartTool, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var in struct {
			Goal  string `json:"goal"`
			Model string `json:"model"`
		}
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || strings.TrimSpace(in.Goal) == "" {
			return ErrorResult(&keel.ToolError{Code: keel.ToolInvalidInput, Message: "goal must be a non-empty string", Path: "/goal"}), nil
		}
		ctx, cancel := s.withRequest(ctx, req.Extra)
		defer cancel()
		call := s.callOf(req.Session, RunStartTool, req.Params.Arguments)
		id, err := runs.StartRun(ctx, call, keel.StartRequest{Goal: in.Goal, Model: in.Model})
		if err != nil {
			var te *keel.ToolError
			if errors.As(err, &te) {
				return ErrorResult(te), nil
			}
			return nil, err
		}
		out, _ := json.Marshal(map[string]string{"run_id": string(id), "trace": TraceURI(id)})
		return Result(out), nil
	})
	s.sdk.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: TraceTemplate, Name: "run-trace", Title: "A keel run's trace",
		Description: "The spans of a run (model and tool calls, with timings, tokens and errors) as a tree, JSON.", MIMEType: "application/json"},
		func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
			uri := req.Params.URI
			id, ok := strings.CutPrefix(uri, "keel://runs/")
			if id, ok = strings.CutSuffix(id, "/trace"); !ok || id == "" || strings.Contains(id, "/") {
				return nil, sdk.ResourceNotFoundError(uri)
			}
			spans, err := runs.RunSpans(ctx, keel.RunID(id), ClientName(req.Session))
			var te *keel.ToolError
			switch {
			case errors.Is(err, keel.ErrNotFound):
				return nil, sdk.ResourceNotFoundError(uri)
			case errors.As(err, &te):
				return nil, &jsonrpc.Error{Code: CodeForbidden, Message: te.Error()}
			case err != nil:
				return nil, err
			}
			b, err := json.Marshal(struct {
				RunID keel.RunID  `json:"run_id"`
				Spans []*SpanNode `json:"spans"`
			}{keel.RunID(id), SpanTree(spans)})
			if err != nil {
				return nil, err
			}
			return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
		})
}

// TraceURI is the URI of run id's trace resource.
func TraceURI(id keel.RunID) string { return "keel://runs/" + string(id) + "/trace" }

// SpanNode is a span of a trace with the spans under it.
type SpanNode struct {
	keel.Span
	Children []*SpanNode `json:"children,omitempty"`
}

// SpanTree arranges spans as trees by ParentID, in the order given; a
// span whose parent is not among them is a root.
func SpanTree(spans []keel.Span) []*SpanNode {
	nodes := make(map[string]*SpanNode, len(spans))
	for i := range spans {
		nodes[spans[i].ID] = &SpanNode{Span: spans[i]}
	}
	roots := []*SpanNode{}
	for i := range spans {
		n := nodes[spans[i].ID]
		if p, ok := nodes[spans[i].ParentID]; ok && spans[i].ParentID != spans[i].ID {
			p.Children = append(p.Children, n)
			continue
		}
		roots = append(roots, n)
	}
	return roots
}

// callOf is the Call of a tools/call of session ss for tool with args.
func (s *Server) callOf(ss *sdk.ServerSession, tool string, args json.RawMessage) Call {
	c := Call{Name: tool, Input: args, Client: ClientName(ss)}
	if canElicit(ss) {
		c.Approve = func(ctx context.Context, d keel.PolicyDecision) (bool, error) {
			return s.approve(ctx, ss, tool, args, d)
		}
	}
	return c
}
