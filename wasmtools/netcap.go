package wasmtools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/api"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// The host module keel offers tools besides WASI. Its only capability is
// the network, and only to granted destinations:
//
//	http_request(req_ptr, req_len u32) -> resp_len u32
//	http_response(buf_ptr, buf_cap u32) -> n u32
//
// http_request reads a JSON request {"method","url","headers","body"},
// performs it if allowed, and keeps a JSON response {"status","headers",
// "body","body_encoding"} or {"error":{"code","message"}} for the call;
// http_response copies that document into guest memory.
const hostModuleName = "keel"

var hostFuncs = map[string]bool{"http_request": true, "http_response": true}

// Limits of the network host function.
const (
	maxHTTPRequestBytes  = 1 << 20
	maxHTTPResponseBytes = 4 << 20
)

// errPrivateAddress is returned by the dialer for loopback, private,
// link-local and other non-public addresses.
var errPrivateAddress = errors.New("destination resolves to a loopback, private or link-local address")

type httpRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

type httpResponse struct {
	Status       int               `json:"status,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	Body         string            `json:"body,omitempty"`
	BodyEncoding string            `json:"body_encoding,omitempty"` // "base64" when the body is not UTF-8
	Error        *hostError        `json:"error,omitempty"`
}

type hostError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// netCall is the per-call network state, carried in the call's context to
// the host functions: the tool's grants, the call's egress check and
// recorder (keel.ToolInvocation's Egress and Touched; nil when it has
// none), the pending response, and the first denial, which turns the
// whole call into a permission_denied error.
type netCall struct {
	tool         string
	grants       []string
	allowPrivate bool
	egress       keel.EgressCheck
	touch        *callTouch

	mu     sync.Mutex
	resp   []byte
	denied *keel.ToolError
}

type netCallKey struct{}

// withNet returns ctx carrying the network state of one call of t, which
// asks egress before each request (if not nil) and records the hosts it
// reaches in touch (if not nil).
func (r *Registry) withNet(ctx context.Context, t *tool, touch *callTouch, egress keel.EgressCheck) (context.Context, *netCall) {
	nc := &netCall{tool: t.info.Spec.Name, grants: t.info.Grants.Network, allowPrivate: r.cfg.AllowPrivateNetwork, egress: egress, touch: touch}
	return context.WithValue(ctx, netCallKey{}, nc), nc
}

// denial returns the error the call fails with for what it was refused,
// or nil.
func (nc *netCall) denial() *keel.ToolError {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return nc.denied
}

// deny records that the call was refused network access to what, unless
// it was refused before: the call fails with permission_denied.
func (nc *netCall) deny(what string) {
	nc.refuse(&keel.ToolError{Code: keel.ToolPermissionDenied, Message: fmt.Sprintf("tool %s tried to reach %s, which is not granted", nc.tool, what)})
}

// denyEgress records that the egress check refused the request to dest
// with err: the call fails with permission_denied giving the reason, or
// with err's code if err is a *keel.ToolError; a *keel.EgressRefusal in
// err is recorded (keel.Touched.Refused).
func (nc *netCall) denyEgress(dest capabilities.Destination, err error) {
	te := &keel.ToolError{Code: keel.ToolPermissionDenied}
	var cause *keel.ToolError
	if errors.As(err, &cause) {
		te.Code = cause.Code
	}
	te.Message = fmt.Sprintf("tool %s tried to reach %s, which was refused: %v", nc.tool, dest, err)
	var pr *keel.EgressRefusal
	if nc.touch != nil && errors.As(err, &pr) {
		nc.touch.refusedBy(*pr)
	}
	nc.refuse(te)
}

func (nc *netCall) refuse(te *keel.ToolError) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.denied == nil {
		nc.denied = te
	}
}

// reached records that the call sends a request to d, or tries to.
func (nc *netCall) reached(d capabilities.Destination) {
	if nc.touch != nil {
		nc.touch.reached(d)
	}
}

// checkEgress asks the call's egress check about a request to u, whose
// destination is d; nil when there is no check or it allows.
func (nc *netCall) checkEgress(ctx context.Context, d capabilities.Destination, u string) error {
	if nc.egress == nil {
		return nil
	}
	if err := nc.egress(ctx, u); err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // the call ended while the check waited: a timeout, not a refusal
		}
		return &egressRefused{dest: d, err: err}
	}
	return nil
}

// egressRefused is a request the call's egress check refused.
type egressRefused struct {
	dest capabilities.Destination
	err  error
}

func (e *egressRefused) Error() string {
	return "egress to " + e.dest.String() + " refused: " + e.err.Error()
}

func (e *egressRefused) Unwrap() error { return e.err }

// instantiateHost adds the keel host module to the runtime.
func (r *Registry) instantiateHost(ctx context.Context) error {
	_, err := r.rt.NewHostModuleBuilder(hostModuleName).
		NewFunctionBuilder().WithFunc(r.httpRequest).Export("http_request").
		NewFunctionBuilder().WithFunc(httpResponseCopy).Export("http_response").
		Instantiate(ctx)
	return err
}

func (r *Registry) httpRequest(ctx context.Context, mod api.Module, ptr, n uint32) uint32 {
	nc, _ := ctx.Value(netCallKey{}).(*netCall)
	resp := r.doHTTP(ctx, nc, mod, ptr, n)
	b, _ := json.Marshal(resp)
	if nc != nil {
		nc.mu.Lock()
		nc.resp = b
		nc.mu.Unlock()
	}
	return uint32(len(b))
}

func httpResponseCopy(ctx context.Context, mod api.Module, ptr, capacity uint32) uint32 {
	nc, _ := ctx.Value(netCallKey{}).(*netCall)
	if nc == nil {
		return 0
	}
	nc.mu.Lock()
	b := nc.resp
	nc.mu.Unlock()
	if uint32(len(b)) > capacity {
		b = b[:capacity]
	}
	if !mod.Memory().Write(ptr, b) {
		return 0
	}
	return uint32(len(b))
}

func (r *Registry) doHTTP(ctx context.Context, nc *netCall, mod api.Module, ptr, n uint32) httpResponse {
	fail := func(code, format string, args ...any) httpResponse {
		return httpResponse{Error: &hostError{Code: code, Message: fmt.Sprintf(format, args...)}}
	}
	if nc == nil {
		return fail("permission_denied", "network access outside a tool call")
	}
	if n > maxHTTPRequestBytes {
		return fail("invalid_request", "request of %d bytes exceeds %d", n, maxHTTPRequestBytes)
	}
	raw, ok := mod.Memory().Read(ptr, n)
	if !ok {
		return fail("invalid_request", "request out of memory bounds")
	}
	var req httpRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return fail("invalid_request", "request is not JSON: %v", err)
	}
	return nc.perform(ctx, req)
}

// perform makes the guest's request req, if the grants and the egress
// check allow it, and returns what the guest sees.
func (nc *netCall) perform(ctx context.Context, req httpRequest) httpResponse {
	fail := func(code, format string, args ...any) httpResponse {
		return httpResponse{Error: &hostError{Code: code, Message: fmt.Sprintf(format, args...)}}
	}
	if req.Method == "" {
		req.Method = http.MethodGet
	}
	dest, err := capabilities.ParseDestination(req.URL)
	if err != nil {
		return fail("invalid_request", "url: %v", err)
	}
	nc.reached(dest)
	if !capabilities.MatchNetwork(nc.grants, dest) {
		nc.deny("network " + dest.String())
		return fail("permission_denied", "%s is not granted to %s", dest, nc.tool)
	}
	hreq, err := http.NewRequestWithContext(ctx, req.Method, req.URL, strings.NewReader(req.Body))
	if err != nil {
		return fail("invalid_request", "%v", err)
	}
	var refused *egressRefused
	if err := nc.checkEgress(ctx, dest, hreq.URL.String()); errors.As(err, &refused) {
		nc.denyEgress(refused.dest, refused.err)
		return fail("permission_denied", "%v", refused)
	}
	for k, v := range req.Headers {
		if strings.EqualFold(k, "Host") {
			continue // the URL decides where the request goes
		}
		hreq.Header.Set(k, v)
	}
	client := httpClient(nc)
	res, err := client.Do(hreq)
	if err != nil {
		var denied *redirectDenied
		var refused *egressRefused
		switch {
		case errors.As(err, &denied):
			nc.deny("network " + denied.dest.String() + " (redirect)")
			return fail("permission_denied", "redirect to %s is not granted to %s", denied.dest, nc.tool)
		case errors.As(err, &refused):
			nc.denyEgress(refused.dest, refused.err)
			return fail("permission_denied", "redirect: %v", refused)
		case errors.Is(err, errPrivateAddress):
			nc.deny("network " + dest.String() + " (private address)")
			return fail("permission_denied", "%s: %v; tools may not reach the local machine or private networks", dest, errPrivateAddress)
		case ctx.Err() != nil:
			return fail("timeout", "request cancelled: %v", ctx.Err())
		}
		return fail("network_error", "%v", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxHTTPResponseBytes+1))
	if err != nil {
		return fail("network_error", "reading the response: %v", err)
	}
	if len(body) > maxHTTPResponseBytes {
		return fail("too_large", "response body exceeds %d bytes", maxHTTPResponseBytes)
	}
	out := httpResponse{Status: res.StatusCode, Headers: map[string]string{}}
	for k := range res.Header {
		out.Headers[k] = res.Header.Get(k)
	}
	if utf8.Valid(body) {
		out.Body = string(body)
	} else {
		out.Body, out.BodyEncoding = base64.StdEncoding.EncodeToString(body), "base64"
	}
	return out
}

type redirectDenied struct{ dest capabilities.Destination }

func (e *redirectDenied) Error() string { return "redirect to " + e.dest.String() + " is not granted" }

// httpClient builds the client of one call: no proxy, no cookies, every
// redirect checked against the grants and by the call's egress check,
// and every connection's resolved
// address checked at dial time, so DNS cannot point a granted name at the
// local machine.
func httpClient(nc *netCall) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if !nc.allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip == nil || !publicIP(ip) {
				return errPrivateAddress
			}
			return nil
		}
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
			DisableKeepAlives:     true,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			d, err := capabilities.ParseDestination(req.URL.String())
			if err == nil {
				nc.reached(d)
			}
			if err != nil || !capabilities.MatchNetwork(nc.grants, d) {
				return &redirectDenied{dest: d}
			}
			return nc.checkEgress(req.Context(), d, req.URL.String())
		},
	}
}

// publicIP reports whether ip is a globally routable unicast address.
func publicIP(ip net.IP) bool {
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsUnspecified() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsMulticast() {
		return false
	}
	if v4 := ip.To4(); v4 != nil {
		// 100.64.0.0/10 (carrier-grade NAT) and 0.0.0.0/8.
		if v4[0] == 100 && v4[1]&0xc0 == 64 || v4[0] == 0 {
			return false
		}
	}
	return true
}
