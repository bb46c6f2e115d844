package capabilities

import "testing"

func TestMatchNetwork(t *testing.T) {
	patterns := []string{"https://api.example.com:443", "http://*.internal.test:8080", "https://files.example.org:*"}
	tests := []struct {
		url  string
		want bool
	}{
		{"https://api.example.com/v1", true},
		{"https://API.example.com:443/", true},
		{"http://api.example.com/", false},       // scheme differs
		{"https://api.example.com:8443/", false}, // port differs
		{"https://evil.com/?x=api.example.com", false},
		{"https://api.example.com.evil.com/", false},
		{"http://a.internal.test:8080/", true},
		{"http://internal.test:8080/", false}, // *. needs a subdomain
		{"http://a.internal.test:80/", false},
		{"https://files.example.org:9999/x", true},
		{"https://user@api.example.com/", true}, // userinfo is not the host
	}
	for _, tt := range tests {
		d, err := ParseDestination(tt.url)
		if err != nil {
			t.Fatalf("ParseDestination(%q) = %v", tt.url, err)
		}
		if got := MatchNetwork(patterns, d); got != tt.want {
			t.Errorf("MatchNetwork(%q) = %v, want %v", tt.url, got, tt.want)
		}
	}
	for _, bad := range []string{"ftp://x/", "file:///etc/passwd", "https:///nohost", "http://x:99999/"} {
		if _, err := ParseDestination(bad); err == nil {
			t.Errorf("ParseDestination(%q) accepted", bad)
		}
	}
}

func TestGuestPathAllowed(t *testing.T) {
	g := Grants{FS: []FSGrant{{HostPath: "/h/ro", GuestPath: "/data", ReadOnly: true}, {HostPath: "/h/rw", GuestPath: "/out"}}}
	tests := []struct {
		p                 string
		allowed, writable bool
	}{
		{"/data/x", true, false},
		{"/data", true, false},
		{"/out/a/b", true, true},
		{"/data/../out/x", true, true},
		{"/database", false, false},
		{"/etc/passwd", false, false},
		{"../../data/x", true, false},
	}
	for _, tt := range tests {
		a, w := g.GuestPathAllowed(tt.p)
		if a != tt.allowed || w != tt.writable {
			t.Errorf("GuestPathAllowed(%q) = %v, %v; want %v, %v", tt.p, a, w, tt.allowed, tt.writable)
		}
	}
}

func TestPatternCovers(t *testing.T) {
	tests := []struct {
		req, grant string
		want       bool
	}{
		{"https://*:443", "https://example.com:443", true},
		{"https://*:443", "http://example.com:443", false},
		{"https://*:443", "https://example.com:8443", false},
		{"https://*:*", "https://example.com:8443", true},
		{"https://*.example.com:443", "https://api.example.com:443", true},
		{"https://*.example.com:443", "https://*.api.example.com:443", true},
		{"https://*.example.com:443", "https://example.com:443", false},
		{"https://*.example.com:443", "https://*:443", false},
		{"https://api.example.com:443", "https://api.example.com:443", true},
		{"https://api.example.com:443", "https://*.example.com:443", false},
		{"https://api.example.com:443", "garbage", false},
	}
	for _, tt := range tests {
		if got := PatternCovers(tt.req, tt.grant); got != tt.want {
			t.Errorf("PatternCovers(%q, %q) = %v, want %v", tt.req, tt.grant, got, tt.want)
		}
	}
	d, _ := ParseDestination("https://anything.test/")
	if !MatchNetwork([]string{"https://*:443"}, d) {
		t.Error("MatchNetwork(https://*:443) does not match any https host")
	}
}

func TestGrantsAdd(t *testing.T) {
	g := Grants{FS: []FSGrant{{HostPath: "/a", GuestPath: "/w", ReadOnly: true}}, Network: []string{"https://x:443"}}
	got := g.Add(Grants{FS: []FSGrant{{HostPath: "/b", GuestPath: "/w"}}, Network: []string{"https://x:443", "https://y:443"}, Env: []string{"E"}})
	if len(got.FS) != 1 || got.FS[0].HostPath != "/b" || got.FS[0].ReadOnly {
		t.Errorf("Add FS = %+v, want /w replaced by /b read-write", got.FS)
	}
	if len(got.Network) != 2 || len(got.Env) != 1 {
		t.Errorf("Add = %+v, want 2 network entries (no duplicate) and 1 env", got)
	}
	if g.FS[0].HostPath != "/a" || len(g.Network) != 1 {
		t.Errorf("Add modified its receiver: %+v", g)
	}
}
