package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/keel-runtime/keel/models"
)

// maxRetryAfter caps a server's Retry-After.
const maxRetryAfter = 24 * time.Hour

// errorf returns a classified error of the provider about model.
func (p *Provider) errorf(kind models.Kind, model string, cause error, format string, args ...any) *models.Error {
	return &models.Error{Kind: kind, Provider: p.name, Model: model, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// ctxError is the error of a call whose caller's context ended: it wraps
// ctx.Err(), so errors.Is(err, context.Canceled) holds.
func (p *Provider) ctxError(model string, err error) *models.Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return p.errorf(models.KindTimeout, model, err, "the caller's deadline passed before the reply was complete")
	}
	return p.errorf(models.KindCancelled, model, err, "the call was cancelled")
}

// classify turns a failed call into a *models.Error. ctx is the caller's
// context, callCtx the call's own (ctx bounded by Config.Timeout), key the
// API key sent (removed from anything the server said), res the HTTP
// response if one arrived.
func (p *Provider) classify(ctx, callCtx context.Context, model, key string, res *http.Response, err error) *models.Error {
	if ctx.Err() != nil {
		return p.ctxError(model, ctx.Err())
	}
	if callCtx.Err() != nil {
		return p.errorf(models.KindTimeout, model, callCtx.Err(),
			"no reply from %s within %v (the provider's timeout); try later or raise the timeout", p.BaseURL(), p.timeout)
	}
	if res != nil && res.StatusCode >= 400 {
		return p.statusError(model, key, res)
	}
	if se, ok := errors.AsType[*ssestream.StreamError](err); ok {
		return p.streamError(model, key, se.Event.Data)
	}
	switch {
	case res == nil && isNetwork(err):
		return p.errorf(models.KindNetwork, model, err,
			"cannot reach %s: is the server running and the base URL right?", p.BaseURL())
	case res == nil:
		return p.errorf(models.KindInvalidRequest, model, err, "the request to %s could not be sent", p.BaseURL())
	case isDecodeError(err):
		return p.invalidReply(model, err)
	default:
		return p.errorf(models.KindNetwork, model, err, "the connection to %s broke during the reply", p.BaseURL())
	}
}

// invalidReply is the error of a reply that is not the API's JSON.
func (p *Provider) invalidReply(model string, cause error) *models.Error {
	return p.errorf(models.KindInvalidRequest, model, cause,
		"the reply from %s is not valid JSON of the OpenAI API: is the base URL the server's OpenAI-compatible API root (usually ending in /v1)?",
		p.BaseURL())
}

// statusError classifies an HTTP error reply: by status (models.StatusKind)
// and by the error code in its body.
func (p *Provider) statusError(model, key string, res *http.Response) *models.Error {
	// The client has read the body already and put it back in memory.
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	code, typ, msg := parseServerError(body)
	if msg == "" {
		msg = snippet(body)
	}
	if msg == "" {
		msg = http.StatusText(res.StatusCode)
	}
	said := fmt.Sprintf("HTTP %d: %s", res.StatusCode, redact(msg, key))

	kind := models.StatusKind(res.StatusCode)
	switch {
	case contextTooLong(code, typ, msg):
		kind = models.KindContextTooLong
	case code == "model_not_found":
		kind = models.KindNotFound
	}
	ra := retryAfter(res.Header, time.Now())
	retry := "retry later"
	if ra > 0 {
		retry = fmt.Sprintf("retry after %v", ra.Round(time.Millisecond))
	}
	var e *models.Error
	switch kind {
	case models.KindAuth:
		p.keys.forget(key)
		if where := p.keys.describe(); where != "" {
			e = p.errorf(kind, model, nil, "%s refused %s (%s): check the key", p.BaseURL(), where, said)
		} else {
			e = p.errorf(kind, model, nil, "%s requires an API key (%s): configure an environment variable or keyring entry for provider %s",
				p.BaseURL(), said, p.name)
		}
	case models.KindRateLimited:
		e = p.errorf(kind, model, nil, "rate limited by %s (%s); %s", p.BaseURL(), said, retry)
	case models.KindOverloaded:
		e = p.errorf(kind, model, nil, "%s failed or is overloaded (%s); %s or use another model", p.BaseURL(), said, retry)
	case models.KindTimeout:
		e = p.errorf(kind, model, nil, "%s timed out (%s); retry later", p.BaseURL(), said)
	case models.KindContextTooLong:
		e = p.errorf(kind, model, nil, "the prompt does not fit the model's context (%s); shorten the conversation or use a model with a longer context", said)
	case models.KindNotFound:
		e = p.errorf(kind, model, nil, "%s does not serve this model (%s); check the model name in the provider's config", p.BaseURL(), said)
	default:
		e = p.errorf(kind, model, nil, "%s refused the request (%s)", p.BaseURL(), said)
	}
	e.Status, e.RetryAfter = res.StatusCode, ra
	return e
}

// streamError classifies an error event sent in the middle of a stream,
// such as {"error": {"message": "...", "type": "server_error"}}.
func (p *Provider) streamError(model, key string, data []byte) *models.Error {
	code, typ, msg := parseServerError(data)
	if msg == "" {
		msg = snippet(data)
	}
	msg = redact(msg, key)
	switch {
	case contextTooLong(code, typ, msg):
		return p.errorf(models.KindContextTooLong, model, nil,
			"the prompt does not fit the model's context (%s); shorten the conversation or use a model with a longer context", msg)
	case typ == "invalid_request_error":
		return p.errorf(models.KindInvalidRequest, model, nil, "%s refused the request during the reply (%s)", p.BaseURL(), msg)
	default:
		return p.errorf(models.KindOverloaded, model, nil, "%s failed during the reply (%s); retry later", p.BaseURL(), msg)
	}
}

// contextTooLong reports whether a server error means the prompt exceeds
// the model's context. OpenAI sends the code context_length_exceeded; the
// llama.cpp server the type exceed_context_size_error; vLLM only a message
// ("This model's maximum context length is 4096 tokens. However, ...").
func contextTooLong(code, typ, msg string) bool {
	return code == "context_length_exceeded" ||
		typ == "exceed_context_size_error" ||
		strings.Contains(strings.ToLower(msg), "maximum context length")
}

// parseServerError reads an error body: OpenAI's {"error": {"message",
// "type", "code"}}, a bare {"error": "..."}, vLLM's flat {"message",
// "type", "code"} or FastAPI's {"detail": ...}. All are empty when body is
// none of these.
func parseServerError(body []byte) (code, typ, msg string) {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) != nil {
		return "", "", ""
	}
	if len(v.Error) > 0 && v.Error[0] == '{' {
		var e struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		}
		json.Unmarshal(v.Error, &e)
		return scalar(e.Code), e.Type, e.Message
	}
	if s := scalar(v.Error); s != "" {
		return "", "", s
	}
	if v.Message != "" {
		return scalar(v.Code), v.Type, v.Message
	}
	return "", "", scalar(v.Detail)
}

// scalar returns a JSON string's value, "" for null or nothing, else the
// JSON text (a number code, say).
func scalar(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if t := strings.TrimSpace(string(raw)); t != "null" {
		return t
	}
	return ""
}

// snippet returns the start of a body that is not an API error, on one
// line, for a message.
func snippet(body []byte) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
}

// retryAfter reads how long the server asks to wait: OpenAI's
// Retry-After-Ms, else Retry-After in seconds or as an HTTP date. It is 0
// when there is none, and at most 24h.
func retryAfter(h http.Header, now time.Time) time.Duration {
	var d time.Duration
	if ms, err := strconv.ParseFloat(strings.TrimSpace(h.Get("Retry-After-Ms")), 64); err == nil && ms > 0 {
		d = time.Duration(min(ms, float64(maxRetryAfter/time.Millisecond)) * float64(time.Millisecond))
	} else if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil {
			if s > 0 {
				d = time.Duration(min(s, maxRetryAfter.Seconds()) * float64(time.Second))
			}
		} else if t, err := http.ParseTime(v); err == nil {
			d = t.Sub(now)
		}
	}
	return max(0, min(d, maxRetryAfter))
}

// isNetwork reports whether err is a failure to connect or a connection
// lost: what http.Client returns for refused, reset and cut connections.
func isNetwork(err error) bool {
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isDecodeError reports whether err, after a successful status, means the
// reply is not the API's JSON rather than a broken connection.
func isDecodeError(err error) bool {
	if _, ok := errors.AsType[*json.SyntaxError](err); ok {
		return true
	}
	_, ok := errors.AsType[*json.UnmarshalTypeError](err)
	return ok
}
