package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

const home = "/home/ada"

func TestNormalizePath(t *testing.T) {
	t.Parallel()
	link := func(p string) (string, error) {
		if rest, ok := strings.CutPrefix(p, "/work/link"); ok {
			return "/home/ada/secret" + rest, nil
		}
		return p, nil
	}
	tests := []struct {
		in   string
		o    PathOptions
		want string // "" wants an error
	}{
		{"/a/b", PathOptions{}, "/a/b"},
		{"/a/b/", PathOptions{}, "/a/b"},
		{"//a//b/./c/", PathOptions{}, "/a/b/c"},
		{"/a/x/../b", PathOptions{}, "/a/b"},
		{"/../../etc/passwd", PathOptions{}, "/etc/passwd"},
		{"~/notes", PathOptions{Home: home}, "/home/ada/notes"},
		{"~", PathOptions{Home: home}, "/home/ada"},
		{"~/", PathOptions{Home: home}, "/home/ada"},
		{"~/notes", PathOptions{}, ""},
		{"~bob/notes", PathOptions{Home: home}, ""},
		{"notes/a", PathOptions{Base: "/w"}, "/w/notes/a"},
		{"../etc", PathOptions{Base: "/w"}, "/etc"},
		{"notes/a", PathOptions{}, ""},
		{"", PathOptions{}, ""},
		{"/a\x00b", PathOptions{}, ""},
		{"/caf" + "e\u0301", PathOptions{}, "/caf\u00e9"}, // NFD to NFC
		{"/Home/ADA", PathOptions{FoldCase: true}, "/home/ada"},
		{"/Home/ADA", PathOptions{}, "/Home/ADA"},
		{"/STRAẞE", PathOptions{FoldCase: true}, "/strasse"},
		{"/work/link/k", PathOptions{Resolve: link}, "/home/ada/secret/k"},
		{"/work/x/../link/k/", PathOptions{Resolve: link}, "/home/ada/secret/k"},
		{"/x", PathOptions{Resolve: func(string) (string, error) { return "", errors.New("no") }}, ""},
		{"/x", PathOptions{Resolve: func(string) (string, error) { return "rel", nil }}, ""},
	}
	for _, tt := range tests {
		got, err := NormalizePath(tt.in, tt.o)
		if tt.want == "" {
			if err == nil {
				t.Errorf("NormalizePath(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NormalizePath(%q) = %q, %v, want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestPathGlob(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pat, path string
		want      bool
	}{
		{"/a/b", "/a/b", true},
		{"/a/b", "/a/bc", false},
		{"/a/*", "/a/b", true},
		{"/a/*", "/a/b/c", false},
		{"/a/*", "/a", false},
		{"/a/**", "/a", true},
		{"/a/**", "/a/b/c", true},
		{"/a/**", "/ab", false},
		{"/a/**/z", "/a/z", true},
		{"/a/**/z", "/a/b/c/z", true},
		{"/a/**/z", "/a/b/c/zz", false},
		{"/**", "/", true},
		{"/**", "/x/y", true},
		{"/a/*.go", "/a/x.go", true},
		{"/a/*.go", "/a/x.go/y", false},
		{"/a/?.go", "/a/é.go", true},
		{"/a/?.go", "/a/xy.go", false},
		{"/a/b/", "/a/b", true},
		{"~/secret/**", "/home/ada/secret/k", true},
		{"/a/**/b/**/c", "/a/x/b/y/c", true},
		{"/a/**/**/c", "/a/c", true},
	}
	for _, tt := range tests {
		g, err := CompilePathGlob(tt.pat, PathOptions{Home: home})
		if err != nil {
			t.Fatalf("CompilePathGlob(%q): %v", tt.pat, err)
		}
		if got := g.Match(tt.path); got != tt.want {
			t.Errorf("CompilePathGlob(%q).Match(%q) = %v, want %v", tt.pat, tt.path, got, tt.want)
		}
	}
	for _, bad := range []string{"", "relative/x", "*/x", "/**/a/**/b/**/c/**/d/**"} {
		if _, err := CompilePathGlob(bad, PathOptions{Home: home}); !errors.Is(err, ErrPattern) {
			t.Errorf("CompilePathGlob(%q) = %v, want ErrPattern", bad, err)
		}
	}
}

// pathVariants are ways to write the same path that a matcher must see
// through.
func pathVariants(p string, foldCase bool) []string {
	vs := []string{
		p + "/",
		p + "/.",
		strings.Replace(p, "/", "//", 1),
		strings.Replace(p, "/", "/zz/../", 1),
		strings.Replace(p, "/", "/./", 1),
		"/.." + p,
		norm.NFD.String(p),
	}
	if rest, ok := strings.CutPrefix(p, home); ok && (rest == "" || rest[0] == '/') {
		vs = append(vs, "~"+rest)
	}
	if foldCase {
		vs = append(vs, strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' {
				return r - 'a' + 'A'
			}
			return r
		}, p))
	}
	return vs
}

// FuzzPathGlob checks, for any path, that every way of writing it
// normalizes to the same path and so matches the same patterns, that
// normalizing is idempotent, and that a match under a directory pattern
// is really under that directory.
func FuzzPathGlob(f *testing.F) {
	for _, s := range []string{
		"/home/ada/secret/key", "/home/ada/secret", "/home/ada/secretx", "/home/ada/SECRET/k",
		"/home/ada/café/x", "/home/ada/cafe\u0301/x", "/home/ada/x/../secret/k", "/", "/a//b/",
		"/home/ada/secret/../../ada/secret/k", "/home/ada/sec*et", "/home/ada/ſecret/k",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	pats := []string{"~/secret/**", "/home/ada/caf\u00e9/**", "/home/*/secret/*", "/**/key", "/home/ada/s?cret/**"}
	f.Fuzz(func(t *testing.T, p string, foldCase bool) {
		o := PathOptions{Home: home, FoldCase: foldCase}
		n, err := NormalizePath(p, o)
		if err != nil {
			return
		}
		if n2, err := NormalizePath(n, o); err != nil || n2 != n {
			t.Fatalf("NormalizePath not idempotent: %q -> %q -> %q, %v", p, n, n2, err)
		}
		for _, ps := range pats {
			g, err := CompilePathGlob(ps, o)
			if err != nil {
				t.Fatal(err)
			}
			want := g.Match(n)
			if ps == "~/secret/**" && want {
				under := fold(home + "/secret")
				if !foldCase {
					under = home + "/secret"
				}
				if n != under && !strings.HasPrefix(n, under+"/") {
					t.Fatalf("%q matches %q but is not under it", n, ps)
				}
			}
			if !strings.HasPrefix(p, "/") {
				continue
			}
			for _, v := range pathVariants(p, foldCase) {
				nv, err := NormalizePath(v, o)
				if err != nil {
					t.Fatalf("NormalizePath(%q) (a variant of %q): %v", v, p, err)
				}
				if got := g.Match(nv); got != want {
					t.Fatalf("%q matches %q: %v, but its variant %q (-> %q): %v", p, ps, want, v, nv, got)
				}
			}
		}
	})
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	same := map[string][]string{
		"http://127.0.0.1:80/": {
			"http://127.0.0.1/", "http://0x7f.1/", "http://2130706433/", "http://0177.0.0.1/",
			"http://0x7f000001/", "http://0x7F.0.0.1", "http://127.1/", "http://[::ffff:127.0.0.1]/",
			"http://[::FFFF:7f00:1]:80/", "http://user:pw@127.0.0.1:80/", "HTTP://127.0.0.1./",
			"http://%31%32%37.0.0.1/", "http://evil.com@127.0.0.1/", "http://127.0.0.1/?q=1#f",
		},
		"https://xn--bcher-kva.example:443/": {
			"https://bücher.example/", "https://BÜCHER.example/", "https://xn--bcher-kva.example:443",
			"https://XN--BCHER-KVA.EXAMPLE./",
		},
		"https://example.com:443/v1/items": {
			"https://ＥＸＡＭＰＬＥ.com/v1/items", "https://example.com:443/v1/items/",
			"https://example.com/v1/x/../items", "https://example.com/v1/%2e%2e/v1/items",
			"https://example.com//v1/./items", "https://a:b@Example.COM/v1/items?x#y",
		},
	}
	key := func(u URL) string { return fmt.Sprintf("%s://%s:%d%s", u.Scheme, u.Host, u.Port, u.Path) }
	for want, spellings := range same {
		for _, s := range spellings {
			u, err := ParseURL(s)
			if err != nil || key(u) != want {
				t.Errorf("ParseURL(%q) = %s, %v, want %s", s, key(u), err, want)
			}
		}
	}
	for _, bad := range []string{
		"example.com/x", "://x", "http://", "http://a.com:99999/", "http://a.com:0/", "http://a\\@b.com/",
		"http://256.1.1.1/", "http://1.2.3.4.5/", "http://0x100.1.1.1/", "http://1.2.16777216/",
		"http://a b/", "http://[::1/", "http://%zz/", "http://a.com/%zz", "ht%tp://a.com/",
	} {
		if u, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) = %s, want an error", bad, key(u))
		}
	}
}

func TestURLPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pat, url string
		want     bool
	}{
		{"https://api.example.com", "https://api.example.com/v1/x", true},
		{"https://api.example.com", "http://api.example.com/v1/x", false},
		{"https://api.example.com", "https://api.example.com:8443/", false},
		{"https://api.example.com:*", "https://api.example.com:8443/", true},
		{"https://api.example.com/v1/**", "https://api.example.com/v1/x/y", true},
		{"https://api.example.com/v1/**", "https://api.example.com/v1/../admin", false},
		{"https://api.example.com/v1/**", "https://api.example.com/v2", false},
		{"*://api.example.com", "http://api.example.com:8080/", true},
		{"https://*.example.com", "https://a.b.example.com/", true},
		{"https://*.example.com", "https://example.com/", false},
		{"https://*.example.com", "https://badexample.com/", false},
		{"https://*", "https://anything.test/", true},
		{"http://127.0.0.1", "http://0x7f.1/", true},
		{"http://0x7f.1", "http://[::ffff:127.0.0.1]/", true},
		{"http://127.0.0.1", "http://2130706433:80/x", true},
		{"https://bücher.example", "https://xn--bcher-kva.example/", true},
		{"https://api.example.com", "https://api.example.com.evil.test/", false},
		{"https://api.example.com", "https://api.example.com@evil.test/", false},
	}
	for _, tt := range tests {
		p, err := CompileURLPattern(tt.pat)
		if err != nil {
			t.Fatalf("CompileURLPattern(%q): %v", tt.pat, err)
		}
		u, err := ParseURL(tt.url)
		if err != nil {
			t.Fatalf("ParseURL(%q): %v", tt.url, err)
		}
		if got := p.Match(u); got != tt.want {
			t.Errorf("CompileURLPattern(%q).Match(%q) = %v, want %v", tt.pat, tt.url, got, tt.want)
		}
	}
	for _, bad := range []string{"api.example.com", "https://a@b.com", "https://a.com/x?y", "https://a.com:x", "https://[::1", "https://a.com/**/a/**/b/**/c/**/d/**"} {
		if _, err := CompileURLPattern(bad); !errors.Is(err, ErrPattern) {
			t.Errorf("CompileURLPattern(%q) = %v, want ErrPattern", bad, err)
		}
	}
}

// ipv4Forms are the spellings of one IPv4 address a resolver accepts.
func ipv4Forms(a [4]byte) []string {
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	return []string{
		fmt.Sprintf("%d.%d.%d.%d", a[0], a[1], a[2], a[3]),
		strconv.FormatUint(uint64(n), 10),
		fmt.Sprintf("0x%x", n),
		fmt.Sprintf("0%o.0%o.0%o.0%o", a[0], a[1], a[2], a[3]),
		fmt.Sprintf("0x%x.0x%x.0x%x.0x%x", a[0], a[1], a[2], a[3]),
		fmt.Sprintf("%d.%d", a[0], n&0xffffff),
		fmt.Sprintf("%d.%d.%d", a[0], a[1], n&0xffff),
		fmt.Sprintf("[::ffff:%d.%d.%d.%d]", a[0], a[1], a[2], a[3]),
		fmt.Sprintf("[::ffff:%x:%x]", n>>16, n&0xffff),
	}
}

// FuzzURLPattern checks that a host pattern matches however the host is
// written (case, trailing dot, userinfo, explicit default port, every IP
// form), that ParseURL is idempotent, and that nothing panics.
func FuzzURLPattern(f *testing.F) {
	for _, s := range []string{"example.com", "API.Example.COM.", "bücher.example", "127.0.0.1", "0x7f.1", "10.0.0.1", "2130706433", "[::1]", "[::ffff:10.1.2.3]", "a_b.test", "0177.1", "xn--bcher-kva.example", "ＥＸＡＭＰＬＥ.com"} {
		f.Add(s, "/v1/x")
	}
	f.Add("evil.com\\@good.com", "/")
	f.Add("good.com", "/a/%2e%2e/b")
	f.Fuzz(func(t *testing.T, host, p string) {
		if strings.ContainsAny(host, "/?#@") || !strings.HasPrefix(host, "[") && strings.Contains(host, ":") {
			return // not a host alone: a port, or more
		}
		if p == "" || p[0] != '/' {
			p = "/" + p
		}
		u, err := ParseURL("https://" + host + p)
		if err != nil {
			return
		}
		// Idempotent: the normalized URL, written back, reads the same.
		h := u.Host
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		esc := strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(u.Path)
		u2, err := ParseURL(fmt.Sprintf("%s://%s:%d%s", u.Scheme, h, u.Port, esc))
		if err != nil || u2 != u {
			t.Fatalf("ParseURL not idempotent: %q -> %+v -> %+v, %v", host+p, u, u2, err)
		}
		pat, err := CompileURLPattern("https://" + h)
		if err != nil {
			t.Fatalf("CompileURLPattern of normalized host %q: %v", h, err)
		}
		variants := []string{
			"https://" + strings.ToUpper(host) + p,
			"https://user:pass@" + host + p,
			"https://" + host + ":443" + p,
			"HTTPS://" + host + p + "?q#f",
		}
		if !strings.HasSuffix(host, ".") && !strings.Contains(host, "]") {
			variants = append(variants, "https://"+host+"."+p)
		}
		if a, ok := ipv4(u.Host); ok {
			for _, form := range ipv4Forms(a) {
				variants = append(variants, "https://"+form+p)
			}
		}
		for _, v := range variants {
			uv, err := ParseURL(v)
			if err != nil {
				if v == "https://"+strings.ToUpper(host)+p {
					continue // upper-casing can make a name invalid (ß -> SS is fine, but not every rune)
				}
				t.Fatalf("ParseURL(%q), a variant of %q: %v", v, host, err)
			}
			if !pat.Match(uv) {
				t.Fatalf("pattern %q does not match %q (-> %+v), a variant of %q", "https://"+h, v, uv, host)
			}
		}
	})
}

func ipv4(h string) ([4]byte, bool) {
	var a [4]byte
	parts := strings.Split(h, ".")
	if len(parts) != 4 {
		return a, false
	}
	for i, s := range parts {
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return a, false
		}
		a[i] = byte(n)
	}
	return a, true
}

func TestPointerLookup(t *testing.T) {
	t.Parallel()
	doc := []byte(` {"path": "/a/b", "opts": {"urls": ["https://x", "https://y"], "n": 3, "ok": true, "z": null},
		"a/b": "slash", "m~n": "tilde", "esc": "q\"uo\u00e9te", "k\u0065y": "escaped key", "": "empty"} `)
	tests := []struct {
		ptr, want string
		found     bool
	}{
		{"/path", "/a/b", true},
		{"/opts/urls/1", "https://y", true},
		{"/opts/urls/2", "", false},
		{"/opts/urls/01", "", false},
		{"/opts/urls/-", "", false},
		{"/opts/n", "3", true},
		{"/opts/ok", "true", true},
		{"/opts/z", "null", true},
		{"/opts", "", false},
		{"/a~1b", "slash", true},
		{"/m~0n", "tilde", true},
		{"/esc", "q\"uo\u00e9te", true},
		{"/key", "escaped key", true},
		{"/", "empty", true},
		{"/missing", "", false},
		{"/path/x", "", false},
	}
	for _, tt := range tests {
		p, err := compilePointer(tt.ptr)
		if err != nil {
			t.Fatal(err)
		}
		got, found, err := p.lookup(doc)
		if err != nil || got != tt.want || found != tt.found {
			t.Errorf("lookup(%q) = %q, %v, %v, want %q, %v", tt.ptr, got, found, err, tt.want, tt.found)
		}
	}
	for _, bad := range []string{"x", "/a~2", "/a~"} {
		if _, err := compilePointer(bad); !errors.Is(err, ErrPattern) {
			t.Errorf("compilePointer(%q) = %v, want ErrPattern", bad, err)
		}
	}
}

// FuzzPointerLookup checks the allocation-free scanner against
// encoding/json: on a valid document, a pointer finds what decoding the
// document and walking it finds.
func FuzzPointerLookup(f *testing.F) {
	f.Add(`{"a":{"b":["x","y"]}}`, "/a/b/1")
	f.Add(`{"a":1.5e3,"b":"\u00e9"}`, "/b")
	f.Add(`[1,[2,{"c":false}]]`, "/1/1/c")
	f.Add(`{"a~b":{"c/d":null}}`, "/a~0b/c~1d")
	f.Add(`{"a":"x","a":"y"}`, "/a")
	f.Fuzz(func(t *testing.T, doc, ptr string) {
		p, err := compilePointer(ptr)
		if err != nil {
			return
		}
		got, found, lerr := p.lookup([]byte(doc))
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			return // the scanner checks structure only; tools refuse malformed input
		}
		if lerr != nil {
			if strings.Contains(doc, `\`) || strings.ContainsAny(doc, "\x7f") {
				return
			}
			t.Fatalf("lookup(%q) in valid %q: %v", ptr, doc, lerr)
		}
		// Walk the decoded value. Duplicate keys: encoding/json keeps the
		// last, the scanner finds the first; skip those documents.
		if hasDuplicateKeys([]byte(doc)) {
			return
		}
		for _, tok := range p.toks {
			switch x := v.(type) {
			case map[string]any:
				v = x[tok]
				if _, ok := x[tok]; !ok {
					v = missing{}
				}
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(x) || (len(tok) > 1 && tok[0] == '0') || tok[0] == '+' {
					v = missing{}
				} else {
					v = x[i]
				}
			default:
				v = missing{}
			}
		}
		var want string
		wantFound := true
		switch x := v.(type) {
		case missing, map[string]any, []any:
			wantFound = false
		case string:
			want = x
		case nil:
			want = "null"
		case bool:
			want = strconv.FormatBool(x)
		case float64:
			fv, err := strconv.ParseFloat(got, 64)
			if !found || err != nil || fv != x {
				t.Fatalf("lookup(%q) in %q = %q, %v, want the number %v", ptr, doc, got, found, x)
			}
			return
		}
		if found != wantFound || got != want {
			t.Fatalf("lookup(%q) in %q = %q, %v, want %q, %v", ptr, doc, got, found, want, wantFound)
		}
	})
}

type missing struct{}

func hasDuplicateKeys(doc []byte) bool {
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	var walk func() bool
	walk = func() bool {
		tok, err := dec.Token()
		if err != nil {
			return true
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return false
		}
		seen := map[string]bool{}
		for dec.More() {
			if d == '{' {
				k, _ := dec.Token()
				ks, _ := k.(string)
				if seen[ks] {
					return true
				}
				seen[ks] = true
			}
			if walk() {
				return true
			}
		}
		_, err = dec.Token()
		return err != nil
	}
	return walk()
}
