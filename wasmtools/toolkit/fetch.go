package toolkit

import (
	"encoding/base64"
	"encoding/json"
)

// Request is an HTTP request a tool asks the host to make. The host makes
// it only to destinations the user granted the tool (scheme://host:port),
// never to loopback or private addresses unless the host allows them.
type Request struct {
	Method  string            `json:"method,omitempty"` // default GET
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
}

// Response is what the host got back.
type Response struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding,omitempty"`
	Error        *Error            `json:"error,omitempty"`
}

// Bytes returns the body as bytes, decoding base64 when the host sent a
// body that is not UTF-8 text.
func (r *Response) Bytes() ([]byte, error) {
	if r.BodyEncoding == "base64" {
		return base64.StdEncoding.DecodeString(r.Body)
	}
	return []byte(r.Body), nil
}

// Fetch makes req through the host. A refusal or a network failure is a
// *Error (code permission_denied, timeout, network_error, too_large,
// invalid_request); an HTTP error status is not an error. A tool whose
// request is refused fails as a whole with permission_denied, naming the
// destination, whatever it returns.
func Fetch(req Request) (*Response, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := hostHTTP(raw)
	if err != nil {
		return nil, err
	}
	var resp Response
	if err := json.Unmarshal(out, &resp); err != nil {
		return nil, Errorf("network_error", "host response is not JSON: %v", err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	return &resp, nil
}
