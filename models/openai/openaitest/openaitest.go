package openaitest

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Models the server serves unless SetModels says otherwise.
const (
	ChatModel  = "keel-test-chat"
	EmbedModel = "keel-test-embed"
)

// Paths of the API the server serves.
const (
	ChatPath       = "/v1/chat/completions"
	EmbeddingsPath = "/v1/embeddings"
	ModelsPath     = "/v1/models"
)

// Request is one HTTP request the server received: all of it, every
// header and every byte of the body as sent.
type Request struct {
	Method string
	Path   string
	Query  string // the raw query, without "?"
	Header http.Header
	Body   []byte
}

// Contains reports whether s occurs anywhere in r: its method, path,
// query, a header's name or value, or its body.
func (r Request) Contains(s string) bool {
	if strings.Contains(r.Method, s) || strings.Contains(r.Path, s) || strings.Contains(r.Query, s) || bytes.Contains(r.Body, []byte(s)) {
		return true
	}
	for k, vs := range r.Header {
		if strings.Contains(k, s) || slices.ContainsFunc(vs, func(v string) bool { return strings.Contains(v, s) }) {
			return true
		}
	}
	return false
}

// APIError is the error object of an OpenAI error reply, sent as
// {"error": {...}}.
type APIError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
}

// ToolCall is a tool call of a scripted reply.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON, streamed in pieces
}

// Usage is the token count of a scripted reply.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
}

// Cut is how a scripted stream ends early.
type Cut int

const (
	NoCut Cut = iota
	// CutEnd ends the response cleanly, with no finish reason, usage
	// or [DONE].
	CutEnd
	// CutClose closes the connection mid-response: the client reads an
	// unexpected EOF.
	CutClose
	// CutHang keeps the connection open, sending nothing more, until the
	// client goes away.
	CutHang
)

// Reply scripts the answer to one request. The zero Reply is the fake
// model's answer; each field replaces or breaks part of it.
type Reply struct {
	// Delay holds the whole response back, first byte included, or until
	// the client gives up.
	Delay time.Duration
	// Header is added to the response (Retry-After, say).
	Header http.Header
	// Status, when not 0, answers with that HTTP status and an error
	// body: {"error": Error}, or Body when set.
	Status int
	Error  *APIError
	// Body is sent as is, with Status or 200, as application/json.
	Body string

	// Content (fragments, one per chunk) and ToolCalls replace the fake
	// model's reply. FinishReason "" means "tool_calls" when there are
	// tool calls, else "stop". Usage nil means counted by the server.
	Content      []string
	ToolCalls    []ToolCall
	FinishReason string
	Usage        *Usage

	// Cut ends a stream after CutAfter events (the first event is the
	// role chunk).
	Cut      Cut
	CutAfter int
	// StreamError, when set, is sent as an error event after CutAfter
	// events, and the response ends.
	StreamError *APIError
	// Events, when not nil, are streamed instead of the reply as the data
	// of one event each, and nothing else: include "[DONE]" to end well.
	Events []string
}

// Server is an OpenAI-compatible HTTP server on loopback. It is safe for
// concurrent use.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	key      string
	models   []string
	requests []Request
	scripts  map[string][]Reply // by path
	seq      int
}

// New starts a server serving ChatModel and EmbedModel with no API key
// required; it is closed when t ends.
func New(t testing.TB) *Server {
	s := &Server{models: []string{ChatModel, EmbedModel}, scripts: map[string][]Reply{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// URL returns the API root, such as "http://127.0.0.1:41234/v1".
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// Client returns an HTTP client for the server whose connections close
// with it.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Close shuts the server down; later requests are refused. It blocks
// until the requests in progress have ended.
func (s *Server) Close() { s.srv.Close() }

// SetKey makes the server require "Authorization: Bearer key"; "" requires
// nothing.
func (s *Server) SetKey(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = key
}

// SetModels sets the models the server serves and lists.
func (s *Server) SetModels(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models = slices.Clone(names)
}

// Script queues replies for the next requests to ChatPath, one each, in
// order; once they are used the fake model answers again.
func (s *Server) Script(replies ...Reply) { s.ScriptPath(ChatPath, replies...) }

// ScriptPath queues replies for the next requests to path.
func (s *Server) ScriptPath(path string, replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[path] = append(s.scripts[path], replies...)
}

// Find returns the requests received so far that contain s anywhere
// (see Request.Contains), in order of arrival: a test that a string
// never left the machine asks for none.
func (s *Server) Find(str string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Contains(str) {
			out = append(out, r)
		}
	}
	return out
}

// Requests returns every request received so far, in order of arrival,
// including those the server refused.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
	var reply Reply
	if q := s.scripts[r.URL.Path]; len(q) > 0 {
		reply, s.scripts[r.URL.Path] = q[0], q[1:]
	}
	key := s.key
	s.seq++
	seq := s.seq
	s.mu.Unlock()

	if reply.Delay > 0 {
		t := time.NewTimer(reply.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	if key != "" {
		switch got := r.Header.Get("Authorization"); {
		case got == "":
			writeError(w, http.StatusUnauthorized, APIError{Type: "invalid_request_error",
				Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth."})
			return
		case got != "Bearer "+key:
			writeError(w, http.StatusUnauthorized, APIError{Type: "invalid_request_error", Code: "invalid_api_key",
				Message: fmt.Sprintf("Incorrect API key provided: %s. You can find your API key at https://platform.openai.com/account/api-keys.", strings.TrimPrefix(got, "Bearer "))})
			return
		}
	}
	for k, vs := range reply.Header {
		w.Header()[k] = vs
	}
	switch {
	case reply.Body != "":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(cmp.Or(reply.Status, http.StatusOK))
		io.WriteString(w, reply.Body)
		return
	case reply.Status != 0:
		e := APIError{Type: "server_error", Message: http.StatusText(reply.Status)}
		if reply.Error != nil {
			e = *reply.Error
		}
		writeError(w, reply.Status, e)
		return
	}

	method := http.MethodPost
	if r.URL.Path == ModelsPath {
		method = http.MethodGet
	}
	if r.Method != method && slices.Contains([]string{ChatPath, EmbeddingsPath, ModelsPath}, r.URL.Path) {
		writeError(w, http.StatusMethodNotAllowed, APIError{Type: "invalid_request_error", Message: "Method not allowed: use " + method})
		return
	}
	switch r.URL.Path {
	case ChatPath:
		s.chat(w, r, body, reply, seq)
	case EmbeddingsPath:
		s.embeddings(w, body)
	case ModelsPath:
		s.list(w)
	default:
		writeError(w, http.StatusNotFound, APIError{Type: "invalid_request_error", Code: "unknown_url",
			Message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path)})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, e APIError) {
	writeJSON(w, status, struct {
		Error APIError `json:"error"`
	}{e})
}

func invalid(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Message: fmt.Sprintf(format, args...)})
}

func (s *Server) serves(model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.models, model)
}

func modelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, APIError{Type: "invalid_request_error", Code: "model_not_found",
		Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)})
}

// The request of POST /v1/chat/completions, as far as the server reads it.
type chatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
	Tools               []tool `json:"tools"`
	ResponseFormat      *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict bool            `json:"strict"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"` // a string or content parts
	ToolCalls  []toolCall      `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type toolCall struct {
	Index    *int   `json:"index,omitempty"` // in stream deltas only
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      bool            `json:"strict"`
	} `json:"function"`
}

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// text returns a message's text: its string content or its text parts.
// It fails on a content part that is neither text nor an image URL.
func (m message) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL *struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.Type == "text":
			b.WriteString(p.Text)
		case p.Type == "image_url" && m.Role == "user" && p.ImageURL != nil &&
			(strings.HasPrefix(p.ImageURL.URL, "data:image/") || strings.HasPrefix(p.ImageURL.URL, "https://")):
		default:
			return "", fmt.Errorf("invalid content part of type %q in a %s message", p.Type, m.Role)
		}
	}
	return b.String(), nil
}

// check refuses what OpenAI refuses; it returns the message of a 400.
func (req *chatRequest) check() string {
	if len(req.Messages) == 0 {
		return "'messages' must contain at least one message."
	}
	calls := map[string]bool{}
	for i, m := range req.Messages {
		if _, err := m.text(); err != nil {
			return fmt.Sprintf("messages[%d]: %v", i, err)
		}
		switch m.Role {
		case "system", "developer", "user":
		case "assistant":
			if (len(m.Content) == 0 || string(m.Content) == "null") && len(m.ToolCalls) == 0 {
				return fmt.Sprintf("messages[%d]: an assistant message needs content or tool_calls.", i)
			}
			for _, c := range m.ToolCalls {
				if c.ID == "" || c.Type != "function" || c.Function.Name == "" {
					return fmt.Sprintf("messages[%d]: a tool call needs an id, type function and a function name.", i)
				}
				calls[c.ID] = true
			}
		case "tool":
			if !calls[m.ToolCallID] {
				return fmt.Sprintf("messages[%d]: messages with role 'tool' must be a response to a preceding message with 'tool_calls' (no call %q).", i, m.ToolCallID)
			}
		default:
			return fmt.Sprintf("messages[%d]: invalid role %q.", i, m.Role)
		}
	}
	if req.StreamOptions != nil && !req.Stream {
		return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
	}
	for i, t := range req.Tools {
		var params map[string]any
		if t.Type != "function" || !toolName.MatchString(t.Function.Name) ||
			(len(t.Function.Parameters) > 0 && json.Unmarshal(t.Function.Parameters, &params) != nil) {
			return fmt.Sprintf("tools[%d]: want type function, a name of [a-zA-Z0-9_-]{1,64} and parameters as a JSON Schema object.", i)
		}
	}
	if f := req.ResponseFormat; f != nil {
		var schema map[string]any
		switch {
		case f.Type == "text", f.Type == "json_object":
		case f.Type == "json_schema" && f.JSONSchema != nil && f.JSONSchema.Name != "" && json.Unmarshal(f.JSONSchema.Schema, &schema) == nil && schema != nil:
		default:
			return "response_format: want type text, json_object, or json_schema with a name and a schema object."
		}
	}
	return ""
}

// answer is the reply to a chat request: content fragments, tool calls and
// finish reason.
type answer struct {
	content []string
	calls   []ToolCall
	finish  string
}

// model is the fake model: see the package doc.
func (s *Server) model(req *chatRequest) answer {
	last := req.Messages[len(req.Messages)-1]
	switch {
	case len(req.Tools) > 0 && last.Role == "user":
		t := req.Tools[0].Function
		args, _ := json.Marshal(instance(t.Parameters))
		s.mu.Lock()
		s.seq++
		id := fmt.Sprintf("call_%d", s.seq)
		s.mu.Unlock()
		return answer{calls: []ToolCall{{ID: id, Name: t.Name, Arguments: string(args)}}}
	case last.Role == "tool":
		result, _ := last.text()
		return answer{content: words("The tool answered " + result + ". That is all I know.")}
	case req.ResponseFormat != nil && req.ResponseFormat.Type == "json_schema":
		doc, _ := json.Marshal(instance(req.ResponseFormat.JSONSchema.Schema))
		return answer{content: pieces(string(doc), 5)}
	case req.ResponseFormat != nil && req.ResponseFormat.Type == "json_object":
		return answer{content: []string{"{}"}}
	}
	return answer{content: words("Once upon a time, a small cat named Tom lived in a big red house. " +
		"Every morning he sat by the window and watched the birds. One day a bird sat on the sill, " +
		"and Tom said hello. They were friends from that day on. The end.")}
}

// words splits text before each space.
func words(text string) []string {
	var out []string
	for len(text) > 0 {
		i := strings.IndexByte(text[1:], ' ')
		if i < 0 {
			return append(out, text)
		}
		out = append(out, text[:i+1])
		text = text[i+1:]
	}
	return out
}

// pieces splits text into pieces of n bytes.
func pieces(text string, n int) []string {
	var out []string
	for len(text) > n {
		out = append(out, text[:n])
		text = text[n:]
	}
	return append(out, text)
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, body []byte, reply Reply, seq int) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		invalid(w, "We could not parse the JSON body of your request: %v", err)
		return
	}
	if !s.serves(req.Model) {
		modelNotFound(w, req.Model)
		return
	}
	if msg := req.check(); msg != "" {
		invalid(w, "%s", msg)
		return
	}

	a := answer{content: reply.Content, calls: reply.ToolCalls, finish: reply.FinishReason}
	if a.content == nil && a.calls == nil {
		a = s.model(&req)
	}
	limit := cmp.Or(req.MaxCompletionTokens, req.MaxTokens)
	if limit > 0 && len(a.content) > limit {
		a.content, a.finish = a.content[:limit], "length"
	}
	if a.finish == "" {
		a.finish = "stop"
		if len(a.calls) > 0 {
			a.finish = "tool_calls"
		}
	}
	u := usage{CompletionTokens: len(a.content) + len(a.calls)}
	for _, m := range req.Messages {
		t, _ := m.text()
		u.PromptTokens += 3 + len(strings.Fields(t))
	}
	if reply.Usage != nil {
		u = usage{PromptTokens: reply.Usage.PromptTokens, CompletionTokens: reply.Usage.CompletionTokens}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	id := fmt.Sprintf("chatcmpl-%d", seq)

	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": nil}
		if len(a.content) > 0 || len(a.calls) == 0 {
			msg["content"] = strings.Join(a.content, "")
		}
		if len(a.calls) > 0 {
			var calls []toolCall
			for _, c := range a.calls {
				tc := toolCall{ID: c.ID, Type: "function"}
				tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
				calls = append(calls, tc)
			}
			msg["tool_calls"] = calls
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": a.finish, "logprobs": nil}},
			"usage":   u,
		})
		return
	}

	events := reply.Events
	if events == nil {
		events = streamEvents(id, req.Model, a, u, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	}
	cut := reply.Cut != NoCut || reply.StreamError != nil
	if cut && reply.CutAfter < len(events) {
		events = events[:reply.CutAfter]
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for _, e := range events {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", e); err != nil || rc.Flush() != nil {
			return // the client went away
		}
	}
	switch {
	case reply.StreamError != nil:
		b, _ := json.Marshal(struct {
			Error APIError `json:"error"`
		}{*reply.StreamError})
		fmt.Fprintf(w, "data: %s\n\n", b)
	case reply.Cut == CutClose:
		if conn, _, err := rc.Hijack(); err == nil {
			conn.Close()
		}
	case reply.Cut == CutHang:
		<-r.Context().Done()
	}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// streamEvents returns the data of the events streaming a: a role chunk,
// a chunk per content fragment, the tool calls (name first, then the
// arguments in pieces), the finish chunk, the usage chunk when asked for,
// and [DONE].
func streamEvents(id, model string, a answer, u usage, withUsage bool) []string {
	created := time.Now().Unix()
	var out []string
	add := func(delta map[string]any, finish any, usage any) {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}}
		if delta == nil {
			c["choices"] = []any{}
		}
		if withUsage {
			c["usage"] = usage
		}
		b, _ := json.Marshal(c)
		out = append(out, string(b))
	}
	add(map[string]any{"role": "assistant", "content": ""}, nil, nil)
	for _, f := range a.content {
		add(map[string]any{"content": f}, nil, nil)
	}
	for i, c := range a.calls {
		first := toolCall{Index: &i, ID: c.ID, Type: "function"}
		first.Function.Name = c.Name
		add(map[string]any{"tool_calls": []toolCall{first}}, nil, nil)
		for _, p := range pieces(c.Arguments, 4) {
			frag := toolCall{Index: &i}
			frag.Function.Arguments = p
			add(map[string]any{"tool_calls": []toolCall{frag}}, nil, nil)
		}
	}
	add(map[string]any{}, a.finish, nil)
	if withUsage {
		add(nil, nil, u)
	}
	return append(out, "[DONE]")
}

func (s *Server) embeddings(w http.ResponseWriter, body []byte) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		invalid(w, "We could not parse the JSON body of your request: %v", err)
		return
	}
	if !s.serves(req.Model) {
		modelNotFound(w, req.Model)
		return
	}
	var inputs []string
	if json.Unmarshal(req.Input, &inputs) != nil {
		var one string
		if json.Unmarshal(req.Input, &one) != nil {
			invalid(w, "'input' must be a string or an array of strings.")
			return
		}
		inputs = []string{one}
	}
	if len(inputs) == 0 {
		invalid(w, "'input' must not be empty.")
		return
	}
	data := make([]any, len(inputs))
	tokens := 0
	for i, text := range inputs {
		tokens += len(strings.Fields(text))
		var vec any = Vector(text)
		if req.EncodingFormat == "base64" {
			b := make([]byte, 0, 4*len(Vector(text)))
			for _, x := range Vector(text) {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
			vec = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": vec}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": req.Model,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}

// Vector returns the embedding the server gives text: 8 dimensions of
// unit length, derived from a hash of text.
func Vector(text string) []float32 {
	h := fnv.New64a()
	io.WriteString(h, text)
	sum := h.Sum64()
	v := make([]float32, 8)
	var norm float64
	for i := range v {
		x := float64(int(sum>>(8*i)&0xff)-128) + 0.5
		v[i] = float32(x)
		norm += x * x
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / math.Sqrt(norm))
	}
	return v
}

func (s *Server) list(w http.ResponseWriter) {
	s.mu.Lock()
	names := slices.Clone(s.models)
	s.mu.Unlock()
	data := make([]any, len(names))
	for i, n := range names {
		data[i] = map[string]any{"id": n, "object": "model", "created": 1700000000, "owned_by": "keel"}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}
