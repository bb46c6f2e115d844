package ipc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// request is a parsed JSON-RPC 2.0 request. id is nil for a
// notification; otherwise it is the id exactly as the client sent it.
type request struct {
	id     json.RawMessage
	method string
	params json.RawMessage
}

// parseRequest parses one frame. On failure it returns the error to send
// and, if the frame had a usable id, a request carrying it.
func parseRequest(data []byte) (*request, *protocol.Error) {
	if !json.Valid(data) {
		return nil, &protocol.Error{Code: protocol.CodeParseError, Message: "parse error: the frame is not valid JSON"}
	}
	trimmed := bytes.TrimSpace(data)
	switch trimmed[0] {
	case '{':
	case '[':
		return nil, invalidRequest("batch requests are not supported; send one request per frame")
	default:
		return nil, invalidRequest("a request must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return nil, invalidRequest("a request must be a JSON object")
	}

	req := &request{}
	if id, ok := m["id"]; ok {
		switch {
		case len(id) > 0 && (id[0] == '"' || id[0] == '-' || (id[0] >= '0' && id[0] <= '9')):
			req.id = id
		case string(id) == "null":
			req.id = id
		default:
			return nil, invalidRequest("id must be a string, a number or null")
		}
	}
	var version string
	if raw, ok := m["jsonrpc"]; !ok || json.Unmarshal(raw, &version) != nil || version != "2.0" {
		return req, invalidRequest(`jsonrpc must be "2.0"`)
	}
	if raw, ok := m["method"]; !ok || json.Unmarshal(raw, &req.method) != nil || req.method == "" {
		return req, invalidRequest("method must be a non-empty string")
	}
	if raw, ok := m["params"]; ok && string(raw) != "null" {
		switch raw[0] {
		case '{':
			req.params = raw
		case '[':
			return req, &protocol.Error{Code: protocol.CodeInvalidParams, Message: "invalid params: params must be an object; positional params are not supported"}
		default:
			return req, invalidRequest("params must be an object")
		}
	}
	return req, nil
}

func invalidRequest(msg string) *protocol.Error {
	return &protocol.Error{Code: protocol.CodeInvalidRequest, Message: "invalid request: " + msg}
}

// paramError is a CodeInvalidParams error naming the field at fault; the
// field is also in data, as {"field": name}, for clients to point at.
func paramError(field, problem string) *protocol.Error {
	e := &protocol.Error{Code: protocol.CodeInvalidParams, Message: "invalid params: " + problem}
	if field != "" {
		e.Message = "invalid params: " + field + ": " + problem
		e.Data, _ = json.Marshal(map[string]string{"field": field})
	}
	return e
}

// decodeParams decodes raw (an object, or nothing) into v, rejecting
// fields v does not have.
func decodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return paramError("", "params must be an object")
		}
		return paramError(typeErr.Field, fmt.Sprintf("got a JSON %s, want %s", typeErr.Value, jsonKind(typeErr.Type)))
	}
	// encoding/json reports unknown fields only as text:
	// `json: unknown field "x"`.
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if name, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return paramError(strings.Trim(name, `"`), "unknown field")
	}
	return paramError("", msg)
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a " + t.String()
}
