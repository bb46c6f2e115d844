package capabilities

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Destination is where a network request goes.
type Destination struct {
	Scheme string // "http" or "https"
	Host   string // lower-case name or IP literal, without brackets
	Port   int
}

// ParseDestination reads a URL's destination, filling in the scheme's
// default port. Only http and https are destinations.
func ParseDestination(raw string) (Destination, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Destination{}, err
	}
	d := Destination{Scheme: strings.ToLower(u.Scheme), Host: strings.ToLower(u.Hostname())}
	if d.Scheme != "http" && d.Scheme != "https" {
		return Destination{}, fmt.Errorf("scheme %q: only http and https are supported", u.Scheme)
	}
	if d.Host == "" {
		return Destination{}, fmt.Errorf("%q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if d.Port, err = strconv.Atoi(p); err != nil || d.Port < 1 || d.Port > 65535 {
			return Destination{}, fmt.Errorf("port %q out of range", p)
		}
	} else if d.Scheme == "https" {
		d.Port = 443
	} else {
		d.Port = 80
	}
	return d, nil
}

// String renders d as a pattern that matches exactly it.
func (d Destination) String() string {
	host := d.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s://%s:%d", d.Scheme, host, d.Port)
}

// MatchNetwork reports whether d is allowed by one of the patterns. A
// pattern is scheme://host:port; host may be "*" (any host) or start with
// "*." to match any subdomain (not the bare domain); port may be "*". The scheme must
// match exactly: https does not allow http. Anything malformed matches
// nothing.
func MatchNetwork(patterns []string, d Destination) bool {
	for _, p := range patterns {
		if matchOne(p, d) {
			return true
		}
	}
	return false
}

func matchOne(pattern string, d Destination) bool {
	scheme, rest, ok := strings.Cut(pattern, "://")
	if !ok || !strings.EqualFold(scheme, d.Scheme) {
		return false
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return false
	}
	host, port := strings.ToLower(strings.Trim(rest[:i], "[]")), rest[i+1:]
	if port != "*" {
		n, err := strconv.Atoi(port)
		if err != nil || n != d.Port {
			return false
		}
	}
	return hostMatches(host, d.Host)
}

func hostMatches(pattern, host string) bool {
	if pattern == "*" {
		return true
	}
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return pattern == host
}

// splitPattern parses scheme://host:port into its parts.
func splitPattern(p string) (scheme, host, port string, ok bool) {
	scheme, rest, ok := strings.Cut(p, "://")
	i := strings.LastIndex(rest, ":")
	if !ok || i <= 0 || scheme == "" || rest[i+1:] == "" {
		return "", "", "", false
	}
	return strings.ToLower(scheme), strings.ToLower(strings.Trim(rest[:i], "[]")), rest[i+1:], true
}

// PatternCovers reports whether the network pattern req (what a tool
// requests) allows everything the pattern grant allows, so a user may
// grant grant: the same scheme, a port req allows, and a host req
// matches ("*" covers any host, "*.example.com" covers api.example.com
// and *.api.example.com).
func PatternCovers(req, grant string) bool {
	rs, rh, rp, ok1 := splitPattern(req)
	gs, gh, gp, ok2 := splitPattern(grant)
	if !ok1 || !ok2 || rs != gs || (rp != "*" && rp != gp) {
		return false
	}
	if rh == "*" || rh == gh {
		return true
	}
	if gh == "*" {
		return false
	}
	if rest, ok := strings.CutPrefix(gh, "*."); ok {
		gh = "x." + rest // a wildcard grant is covered if any subdomain would be
	}
	return hostMatches(rh, gh)
}
