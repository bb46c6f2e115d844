package ipc

import (
	"errors"
	"strings"
	"testing"
)

func TestOriginPatternMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		origin  string
		want    bool
	}{
		{"http://localhost:5173", "http://localhost:5173", true},
		{"http://localhost:5173", "HTTP://LOCALHOST:5173", true},
		{"HTTP://LocalHost:5173", "http://localhost:5173", true},
		{"http://localhost:5173", "http://localhost:5174", false},
		{"http://localhost:5173", "https://localhost:5173", false},
		{"http://localhost:5173", "http://localhost", false},
		{"http://localhost:5173", "http://localhost.:5173", true}, // trailing dot: the same host
		{"http://localhost:5173/", "http://localhost:5173", true},
		{"http://localhost:5173", "http://user@localhost:5173", false},
		{"http://localhost:5173", "http://localhost:5173/path", false},
		{"http://localhost:5173", "null", false},
		{"http://localhost:5173", "", false},
		{"http://localhost:5173", "http://localhost:05173", false},
		{"http://localhost:5173", "http://evil.example?x=http://localhost:5173", false},
		{"http://localhost", "http://localhost:80", true}, // default ports
		{"http://localhost:80", "http://localhost", true},
		{"https://example.com", "https://example.com:443", true},
		{"https://example.com:443", "http://example.com:443", false},
		{"http://localhost:*", "http://localhost:1", true},
		{"http://localhost:*", "http://localhost:65535", true},
		{"http://localhost:*", "http://localhost", true},
		{"http://localhost:*", "http://127.0.0.1:3000", false},
		{"http://localhost:*", "http://localhost.evil.example:3000", false},
		{"http://localhost:*", "https://localhost:3000", false},
		{"https://*.example.com", "https://app.example.com", true},
		{"https://*.example.com", "https://APP.Example.COM.", true},
		{"https://*.example.com", "https://example.com", false},
		{"https://*.example.com", "https://a.b.example.com", false}, // one label only
		{"https://*.example.com", "https://evilexample.com", false},
		{"https://*.example.com", "https://app.example.com.evil", false},
		{"https://*.example.com", "https://app.example.com:8443", false},
		{"https://*.example.com", "http://app.example.com", false},
		{"https://*.example.com:*", "https://app.example.com:8443", true},
		{"vscode-webview://*", "vscode-webview://1a2b3c4d5e6f", true},
		{"vscode-webview://*", "VSCODE-WEBVIEW://1A2B", true},
		{"vscode-webview://*", "vscode-webview-evil://1a2b", false},
		{"vscode-webview://*", "http://1a2b", false},
		{"vscode-webview://*", "null", false},
		{"http://[::1]:5173", "http://[::1]:5173", true},
		{"http://[::1]:5173", "http://[::2]:5173", false},
		{"http://127.0.0.1:5173", "http://127.0.0.1:5173", true},
		{"http://127.0.0.1:5173", "http://127.0.0.2:5173", false},
	}
	for _, tt := range tests {
		p, err := parseOriginPattern(tt.pattern)
		if err != nil {
			t.Errorf("parseOriginPattern(%q) = %v", tt.pattern, err)
			continue
		}
		if got := (originPatterns{p}).match(tt.origin); got != tt.want {
			t.Errorf("pattern %q matches origin %q = %v, want %v", tt.pattern, tt.origin, got, tt.want)
		}
	}
}

func TestOriginPatternRefused(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		"*", "*://*", "http://*", "https://*", "HTTP://*", "http://*:*", "https://*:443", "http://*/",
		"null", "", "localhost:5173", "http://", "://localhost", "*://localhost",
		"http://localhost:5173/app", "http://localhost:5173?x", "http://localhost:5173#x", "http://user@localhost:5173",
		"http://local*host", "http://*host", "http://a.*.example.com", "http://**.example.com", "https://*.com", "https://*.com.",
		"https://*.*.example.com", "http://*.127.0.0.1", "http://*.[::1]", "http://localhost:", "http://localhost:0",
		"http://localhost:65536", "http://localhost:5x", "http://localhost:05173", "http://[::1", "http://[1.2.3.4]", "vscode-webview://*:5",
		"http://.example.com", "http://a..b", "ht tp://x", "1http://x",
	} {
		if _, err := parseOriginPattern(p); !errors.Is(err, ErrOriginPattern) {
			t.Errorf("parseOriginPattern(%q) = %v, want an ErrOriginPattern", p, err)
		}
	}
}

// FuzzOriginPattern: a pattern that parses never matches a refused
// origin value ("null", userinfo) and, unless its scheme is not http or
// https and its host is "*", never matches origins of two unrelated
// hosts.
func FuzzOriginPattern(f *testing.F) {
	for _, s := range []string{"http://localhost:*", "https://*.example.com", "vscode-webview://*", "http://[::1]:5173", "http://*", "null"} {
		f.Add(s, "http://localhost:3000")
	}
	f.Fuzz(func(t *testing.T, pattern, origin string) {
		p, err := parseOriginPattern(pattern)
		if err != nil {
			return
		}
		ps := originPatterns{p}
		if ps.match("null") || ps.match("http://u@localhost:3000") {
			t.Errorf("pattern %q matches a null or userinfo origin", pattern)
		}
		web := p.scheme == "http" || p.scheme == "https"
		if web && p.anyHost {
			t.Errorf("pattern %q matches every %s host", pattern, p.scheme)
		}
		if web && ps.match(p.scheme+"://unrelated-a.invalid") && ps.match(p.scheme+"://unrelated-b.test") {
			t.Errorf("pattern %q matches unrelated %s hosts", pattern, p.scheme)
		}
		if ps.match(origin) && !strings.EqualFold(strings.SplitN(origin, "://", 2)[0], p.scheme) {
			t.Errorf("pattern %q matches %q of another scheme", pattern, origin)
		}
	})
}
