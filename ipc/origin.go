package ipc

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ErrOriginPattern is wrapped by the errors of origin patterns that are
// malformed or would match too much.
var ErrOriginPattern = errors.New("bad origin pattern")

// originPattern is a compiled allowed-origin pattern (docs/protocol.md#origin-patterns):
//
//	http://localhost:5173     exactly that origin
//	http://localhost:*        any port of a host
//	https://*.example.com     any one label in front of a domain
//	vscode-webview://*        any host of a scheme other than http and https
//
// Scheme and host compare case-insensitively, a default port (80 for
// http, 443 for https) is the same as none, and a trailing dot of the
// origin's host is ignored.
type originPattern struct {
	scheme string
	// host is the host (lower case, no brackets for IPv6), or the domain
	// after "*." when subdomain is set; "" when anyHost.
	host      string
	subdomain bool // "*.host": exactly one label in front of host
	anyHost   bool // "scheme://*"
	port      string
	anyPort   bool
}

// parseOriginPattern compiles a pattern. It refuses, wrapping
// ErrOriginPattern: anything that is not scheme://host[:port] (a path,
// a query, userinfo), "null" (the origin of every sandboxed page and
// local file), a wildcard anywhere but a whole host label or the whole
// port, and patterns that match every origin of http or https ("*",
// "http://*", "https://*:*") or every name under a top-level domain
// ("https://*.com").
func parseOriginPattern(p string) (originPattern, error) {
	bad := func(why string) (originPattern, error) {
		return originPattern{}, fmt.Errorf("%w %q: %s", ErrOriginPattern, p, why)
	}
	switch strings.TrimSpace(p) {
	case "*", "*://*":
		return bad("it would allow every web page; name the origins (e.g. http://localhost:5173, http://localhost:*, https://*.example.com)")
	case "null":
		return bad(`"null" is the origin of every sandboxed page and local file, so allowing it would allow them all`)
	}
	scheme, rest, ok := strings.Cut(p, "://")
	if !ok || scheme == "" || rest == "" {
		return bad("want scheme://host[:port]")
	}
	scheme = strings.ToLower(scheme)
	if strings.ContainsAny(scheme, "*") || !validScheme(scheme) {
		return bad("the scheme must be spelled out (no wildcard)")
	}
	rest = strings.TrimSuffix(rest, "/")
	if strings.ContainsAny(rest, "/?#@\\ ") {
		return bad("an origin has no path, query, fragment or user; want scheme://host[:port]")
	}
	host, port := rest, ""
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.HasSuffix(rest, "]") {
		host, port = rest[:i], rest[i+1:]
		if port == "" {
			return bad("empty port")
		}
	}
	op := originPattern{scheme: scheme}
	switch {
	case port == "*":
		op.anyPort = true
	case port != "":
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return bad("the port must be a number from 1 to 65535, or *")
		}
		op.port = port
	}
	host = strings.ToLower(host)
	web := scheme == "http" || scheme == "https"
	switch {
	case host == "*":
		if web {
			return bad("it would allow every " + scheme + " page; name the host (e.g. " + scheme + "://localhost:*, " + scheme + "://*.example.com)")
		}
		if port != "" {
			return bad(`"*" as the host takes no port`)
		}
		op.anyHost = true
		return op, nil
	case strings.HasPrefix(host, "*."):
		op.subdomain = true
		host = host[2:]
	}
	if strings.Contains(host, "*") {
		return bad("a wildcard may only stand for the whole host, one leading host label (*.example.com) or the port")
	}
	host = strings.TrimSuffix(host, ".")
	if h, ok := strings.CutPrefix(host, "["); ok {
		h, ok = strings.CutSuffix(h, "]")
		if ip := net.ParseIP(h); !ok || ip == nil || ip.To4() != nil || op.subdomain {
			return bad("bad IPv6 address")
		}
		host = h
	}
	if host == "" || strings.Contains(host, "..") || strings.HasPrefix(host, ".") {
		return bad("empty host or host label")
	}
	if op.subdomain && (!strings.Contains(host, ".") || net.ParseIP(host) != nil) {
		return bad("*. needs a domain of at least two labels after it (*.example.com), or it would allow a whole top-level domain")
	}
	op.host = host
	op.port = defaultPortless(scheme, op.port)
	return op, nil
}

// validScheme reports whether s is a URL scheme: a letter, then
// letters, digits, "+", "-" or ".".
func validScheme(s string) bool {
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// defaultPortless returns "" for scheme's default port, else port.
func defaultPortless(scheme, port string) string {
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		return ""
	}
	return port
}

// parsedOrigin is an Origin header taken apart: scheme, host (lower
// case, no trailing dot, no brackets) and port ("" for the scheme's
// default).
type parsedOrigin struct {
	scheme, host, port string
}

// parseOrigin takes an Origin header value apart; ok is false for
// anything that is not a plain scheme://host[:port] ("null", userinfo,
// a path).
func parseOrigin(o string) (parsedOrigin, bool) {
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || u.User != nil || u.Opaque != "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return parsedOrigin{}, false
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	port := u.Port()
	if host == "" || strings.Contains(host, "*") {
		return parsedOrigin{}, false
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return parsedOrigin{}, false
		}
	}
	scheme := strings.ToLower(u.Scheme)
	return parsedOrigin{scheme: scheme, host: host, port: defaultPortless(scheme, port)}, true
}

// match reports whether o matches the pattern.
func (p originPattern) match(o parsedOrigin) bool {
	if o.scheme != p.scheme {
		return false
	}
	if p.anyHost {
		return true
	}
	if !p.anyPort && o.port != p.port {
		return false
	}
	if !p.subdomain {
		return o.host == p.host
	}
	label, ok := strings.CutSuffix(o.host, "."+p.host)
	return ok && label != "" && !strings.Contains(label, ".")
}

// originPatterns is a list of compiled patterns.
type originPatterns []originPattern

func parseOriginPatterns(ps []string) (originPatterns, error) {
	out := make(originPatterns, 0, len(ps))
	for _, p := range ps {
		op, err := parseOriginPattern(p)
		if err != nil {
			return nil, err
		}
		out = append(out, op)
	}
	return out, nil
}

// match reports whether origin (an Origin header's value) matches one
// of the patterns.
func (ps originPatterns) match(origin string) bool {
	if len(ps) == 0 {
		return false
	}
	o, ok := parseOrigin(origin)
	if !ok {
		return false
	}
	for _, p := range ps {
		if p.match(o) {
			return true
		}
	}
	return false
}
