package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// ErrPattern is wrapped by the error of a malformed path glob or URL
// pattern.
var ErrPattern = errors.New("malformed pattern")

// Resolver resolves a normalized absolute path the way the sandbox that
// runs the call would (following its symlinks, mapping a guest path to
// the host), returning the absolute path the call would actually touch.
// A Resolver may be called concurrently. An error makes the path
// unreadable: it matches every restricting rule and no allowing one.
type Resolver func(p string) (string, error)

// PathOptions say how paths are normalized. The zero value expands no ~,
// resolves nothing, and matches case-sensitively.
type PathOptions struct {
	// Home is what ~ stands for. Empty: a path starting with ~ cannot be
	// normalized.
	Home string
	// Base is the directory a relative path is relative to. Empty: a
	// relative path cannot be normalized.
	Base string
	// FoldCase matches paths case-insensitively, as on a case-insensitive
	// file system (macOS, Windows).
	FoldCase bool
	// Resolve, if set, is applied to the cleaned path.
	Resolve Resolver
}

// NormalizePath returns p in the form paths are matched in: slash
// separated, absolute (~ expanded with o.Home, a relative path joined to
// o.Base), NFC-normalized, cleaned of ., .., repeated and trailing
// slashes, resolved through o.Resolve, and case-folded if o.FoldCase. It
// does not allocate when p is already in that form and no Resolve is set.
func NormalizePath(p string, o PathOptions) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q: empty or holds NUL", p)
	}
	if p[0] == '~' {
		if len(p) > 1 && p[1] != '/' {
			return "", fmt.Errorf("path %q: ~user is not supported", p)
		}
		if o.Home == "" {
			return "", fmt.Errorf("path %q: no home directory to expand ~", p)
		}
		p = o.Home + "/" + p[1:]
	} else if p[0] != '/' {
		if o.Base == "" {
			return "", fmt.Errorf("path %q is relative and there is no base directory", p)
		}
		p = o.Base + "/" + p
	}
	if p[0] != '/' {
		return "", fmt.Errorf("path %q: home or base is not absolute", p)
	}
	p = path.Clean(nfc(p))
	if o.Resolve != nil {
		r, err := o.Resolve(p)
		if err != nil {
			return "", fmt.Errorf("path %q: %w", p, err)
		}
		if r == "" || r[0] != '/' {
			return "", fmt.Errorf("path %q resolves to %q, not an absolute path", p, r)
		}
		p = path.Clean(nfc(r))
	}
	if o.FoldCase {
		p = fold(p)
	}
	return p, nil
}

// fold case-folds s (Unicode full case folding, as case-insensitive file
// systems compare names), without allocating for lower-case ASCII.
func fold(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return nfc(cases.Fold().String(s))
		}
	}
	return strings.ToLower(s)
}

func nfc(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return norm.NFC.String(s)
		}
	}
	return s
}

// PathGlob is a compiled path pattern. In a pattern, * matches any run
// of characters within one path segment, ? one character, and ** as a
// whole segment any number of segments (none included): /a/** matches
// /a and everything under it. Other characters match themselves. The
// pattern is normalized like a path (~ expanded, cleaned, NFC, folded).
type PathGlob struct {
	raw  string
	segs []string // normalized segments, "**" collapsed
}

// maxDoubleStars bounds the ** segments of a pattern, which bounds the
// backtracking of a match.
const maxDoubleStars = 4

// CompilePathGlob compiles a pattern, normalizing it with o (Base and
// Resolve are not used: a pattern names paths as written). A pattern
// that is neither absolute nor starts with ~ is an error wrapping
// ErrPattern.
func CompilePathGlob(pattern string, o PathOptions) (PathGlob, error) {
	if pattern == "" || (pattern[0] != '/' && pattern[0] != '~') {
		return PathGlob{}, fmt.Errorf("%w: path %q is not absolute (start it with / or ~)", ErrPattern, pattern)
	}
	n, err := NormalizePath(pattern, PathOptions{Home: o.Home, FoldCase: o.FoldCase})
	if err != nil {
		return PathGlob{}, fmt.Errorf("%w: %w", ErrPattern, err)
	}
	g := PathGlob{raw: pattern}
	stars := 0
	for _, s := range strings.Split(strings.TrimPrefix(n, "/"), "/") {
		if s == "" {
			continue
		}
		if s == "**" {
			if len(g.segs) > 0 && g.segs[len(g.segs)-1] == "**" {
				continue
			}
			if stars++; stars > maxDoubleStars {
				return PathGlob{}, fmt.Errorf("%w: path %q has more than %d ** segments", ErrPattern, pattern, maxDoubleStars)
			}
		}
		g.segs = append(g.segs, s)
	}
	return g, nil
}

// String returns the pattern as written.
func (g PathGlob) String() string { return g.raw }

// Match reports whether the normalized path p (NormalizePath's result)
// matches. It does not allocate.
func (g PathGlob) Match(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	return matchSegs(g.segs, p[1:])
}

// matchSegs matches pattern segments against the rest of a cleaned path
// (segments separated by /, "" being no segment at all).
func matchSegs(ps []string, p string) bool {
	for len(ps) > 0 {
		if ps[0] == "**" {
			ps = ps[1:]
			if len(ps) == 0 {
				return true
			}
			for {
				if matchSegs(ps, p) {
					return true
				}
				i := strings.IndexByte(p, '/')
				if i < 0 {
					return false
				}
				p = p[i+1:]
			}
		}
		if p == "" {
			return false
		}
		seg, rest := p, ""
		if i := strings.IndexByte(p, '/'); i >= 0 {
			seg, rest = p[:i], p[i+1:]
		}
		if !wildcard(ps[0], seg, '/') {
			return false
		}
		ps, p = ps[1:], rest
	}
	return p == ""
}

// wildcard matches s against a pattern where * is any run of characters
// other than sep (any at all when sep is 0) and ? is one such character.
// It is the linear backtracking matcher: a later * supersedes an
// earlier one.
func wildcard[S string | []byte](pat string, s S, sep byte) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		if px < len(pat) {
			switch c := pat[px]; c {
			case '*':
				starP, starS = px, sx
				px++
				continue
			case '?':
				if s[sx] != sep || sep == 0 {
					_, n := decodeRune(s, sx)
					px, sx = px+1, sx+n
					continue
				}
			default:
				if c == s[sx] {
					px, sx = px+1, sx+1
					continue
				}
			}
		}
		if starP < 0 || (sep != 0 && s[starS] == sep) {
			return false
		}
		starS++
		px, sx = starP+1, starS
	}
	for px < len(pat) && pat[px] == '*' {
		px++
	}
	return px == len(pat)
}

func decodeRune[S string | []byte](s S, i int) (rune, int) {
	if s[i] < utf8.RuneSelf {
		return rune(s[i]), 1
	}
	end := min(i+utf8.UTFMax, len(s))
	var buf [utf8.UTFMax]byte
	n := copy(buf[:], s[i:end])
	return utf8.DecodeRune(buf[:n])
}

// URL is a normalized URL: what a request goes to.
type URL struct {
	Scheme string // lower-case
	// Host is lower-case, in its ASCII (punycode) form, or an IP address
	// in canonical form: IPv4 dotted quad (an IPv4-mapped IPv6 address
	// becomes IPv4), IPv6 as netip renders it, without brackets.
	Host string
	Port int    // explicit, or the scheme's default; 0 if it has none
	Path string // percent-decoded, cleaned, "/" at least
}

// defaultPort is the port a scheme implies.
func defaultPort(scheme string) int {
	switch scheme {
	case "http", "ws":
		return 80
	case "https", "wss":
		return 443
	}
	return 0
}

// ParseURL normalizes a URL for matching: scheme and host lower-cased,
// userinfo dropped, the default port filled in, an IDN host converted to
// its ASCII form, an IP host in any form a resolver accepts rewritten
// canonically, the path percent-decoded and cleaned. Query and fragment
// are dropped. A URL without scheme://host is an error, as is one whose
// authority holds a backslash (clients disagree about what it means). It
// does not allocate for an already-canonical URL whose host is a name.
func ParseURL(raw string) (URL, error) {
	var u URL
	i := strings.Index(raw, "://")
	if i <= 0 {
		return u, fmt.Errorf("url %q: want scheme://host", raw)
	}
	u.Scheme = strings.ToLower(raw[:i])
	for j := 0; j < len(u.Scheme); j++ {
		c := u.Scheme[j]
		if !(c >= 'a' && c <= 'z' || j > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return u, fmt.Errorf("url %q: malformed scheme", raw)
		}
	}
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	auth, p := rest[:end], rest[end:]
	if strings.ContainsAny(auth, "\\ \t\r\n") {
		return u, fmt.Errorf("url %q: malformed authority", raw)
	}
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		auth = auth[at+1:]
	}
	host, port := auth, ""
	if strings.HasPrefix(auth, "[") {
		c := strings.IndexByte(auth, ']')
		if c < 0 {
			return u, fmt.Errorf("url %q: unclosed [", raw)
		}
		host, port = auth[1:c], auth[c+1:]
		if strings.IndexByte(host, ':') < 0 {
			return u, fmt.Errorf("url %q: [%s] is not an IPv6 address", raw, host)
		}
		if port != "" {
			if port[0] != ':' {
				return u, fmt.Errorf("url %q: junk after ]", raw)
			}
			port = port[1:]
		}
	} else if c := strings.LastIndexByte(auth, ':'); c >= 0 {
		host, port = auth[:c], auth[c+1:]
	}
	var err error
	if u.Host, err = NormalizeHost(host); err != nil {
		return u, fmt.Errorf("url %q: %w", raw, err)
	}
	if port == "" {
		u.Port = defaultPort(u.Scheme)
	} else {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return u, fmt.Errorf("url %q: port %q out of range", raw, port)
		}
		u.Port = int(n)
	}
	if q := strings.IndexAny(p, "?#"); q >= 0 {
		p = p[:q]
	}
	if strings.IndexByte(p, '%') >= 0 {
		if p, err = percentDecode(p); err != nil {
			return u, fmt.Errorf("url %q: %w", raw, err)
		}
	}
	if p == "" {
		p = "/"
	}
	u.Path = path.Clean(nfc(p))
	return u, nil
}

func percentDecode(s string) (string, error) {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
			return "", fmt.Errorf("malformed escape in %q", s)
		}
		b.WriteByte(byte(unhex(s[i+1])<<4 | unhex(s[i+2])))
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// NormalizeHost returns the canonical form of a host name or IP address
// (without brackets or port): percent escapes decoded, lower-cased, one
// trailing dot dropped, an internationalized name converted to ASCII
// (IDNA lookup rules, so full-width and other compatibility forms map to
// the name they stand for), and an IP address in any form the C
// resolver's inet_aton accepts (0x7f.1, 2130706433, 0177.0.0.1) or an
// IPv4-mapped IPv6 address rewritten as a dotted quad.
func NormalizeHost(h string) (string, error) {
	if strings.IndexByte(h, '%') >= 0 {
		d, err := percentDecode(h)
		if err != nil {
			return "", err
		}
		h = d
	}
	if h == "" {
		return "", errors.New("empty host")
	}
	if strings.IndexByte(h, ':') >= 0 {
		a, err := netip.ParseAddr(h)
		if err != nil || a.Zone() != "" {
			return "", fmt.Errorf("host %q: not an IPv6 address", h)
		}
		return a.Unmap().String(), nil
	}
	ascii := true
	for i := 0; i < len(h); i++ {
		if h[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if !ascii {
		a, err := idna.Lookup.ToASCII(h)
		if err != nil {
			return "", fmt.Errorf("host %q: %w", h, err)
		}
		h = a
	}
	h = strings.ToLower(h)
	h = strings.TrimSuffix(h, ".")
	if h == "" || strings.HasSuffix(h, ".") {
		return "", errors.New("empty host label")
	}
	if v4, ok, err := parseInetAton(h); err != nil {
		return "", fmt.Errorf("host %q: %w", h, err)
	} else if ok {
		return v4, nil
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("host %q: character %q", h, c)
		}
	}
	return h, nil
}

// parseInetAton reads h as an IPv4 address the way inet_aton and URL
// parsers do: one to four parts, each decimal, octal (leading 0) or hex
// (0x), the last part filling the remaining bytes. ok is false when h is
// a name (its last label is not numeric); err is set when it looks like
// an address but is not a valid one.
func parseInetAton(h string) (addr string, ok bool, err error) {
	last := h[strings.LastIndexByte(h, '.')+1:]
	if _, numeric := parseIPPart(last); !numeric {
		return "", false, nil
	}
	var parts [4]uint64
	n := 0
	for s := h; ; {
		part := s
		dot := strings.IndexByte(s, '.')
		if dot >= 0 {
			part = s[:dot]
		}
		if n == 4 {
			return "", true, errors.New("more than four parts")
		}
		v, numeric := parseIPPart(part)
		if !numeric {
			return "", true, errors.New("a numeric last label makes it an IPv4 address, and this is not one")
		}
		parts[n] = v
		n++
		if dot < 0 {
			break
		}
		s = s[dot+1:]
	}
	var ip uint64
	for i := 0; i < n-1; i++ {
		if parts[i] > 255 {
			return "", true, errors.New("part out of range")
		}
		ip |= parts[i] << (8 * (3 - i))
	}
	if parts[n-1] >= 1<<(8*(5-n)) {
		return "", true, errors.New("last part out of range")
	}
	ip |= parts[n-1]
	a := netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})
	return a.String(), true, nil
}

// parseIPPart reads one numeric part of an inet_aton address.
func parseIPPart(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := 10
	switch {
	case len(s) > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'):
		base, s = 16, s[2:]
		if s == "" {
			return 0, true // "0x" is zero to inet_aton
		}
	case len(s) > 1 && s[0] == '0':
		base, s = 8, s[1:]
	}
	// By hand: strconv's error for a name ("dev") would allocate on
	// every decision about a URL.
	var v uint64
	for i := 0; i < len(s); i++ {
		d := unhex(s[i])
		if d < 0 || d >= base {
			return 0, false
		}
		if v = v*uint64(base) + uint64(d); v > 1<<32-1 {
			return 0, false
		}
	}
	return v, true
}

// URLPattern is a compiled URL pattern: scheme://host[:port][/path].
// The scheme may be * (any). The host may be * (any), *.domain (any
// subdomain of domain, not domain itself) or a name or IP address, which
// is normalized like a request's host, so it matches however the host is
// written. The port may be * (any); omitted, it is the scheme's default
// (any, when the scheme is *). The path is a path glob (see PathGlob);
// omitted, it is /** (any path).
type URLPattern struct {
	raw       string
	scheme    string // "" for any
	host      string // "" for any
	subdomain bool   // host is a suffix: match any name ending in "."+host
	port      int    // -1 for any
	path      PathGlob
}

// CompileURLPattern compiles a URL pattern; an error wraps ErrPattern.
func CompileURLPattern(pattern string) (URLPattern, error) {
	p := URLPattern{raw: pattern, port: -1}
	i := strings.Index(pattern, "://")
	if i <= 0 {
		return p, fmt.Errorf("%w: url %q: want scheme://host", ErrPattern, pattern)
	}
	if s := strings.ToLower(pattern[:i]); s != "*" {
		p.scheme = s
	}
	rest := pattern[i+3:]
	auth, pth := rest, "/**"
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		auth, pth = rest[:j], rest[j:]
	}
	if strings.ContainsAny(pth, "?#") || strings.ContainsAny(auth, "@?#") {
		return p, fmt.Errorf("%w: url %q: no userinfo, query or fragment in a pattern", ErrPattern, pattern)
	}
	host, port := auth, ""
	if strings.HasPrefix(auth, "[") {
		c := strings.IndexByte(auth, ']')
		if c < 0 || (c+1 < len(auth) && auth[c+1] != ':') {
			return p, fmt.Errorf("%w: url %q: malformed [address]", ErrPattern, pattern)
		}
		host = auth[1:c]
		if strings.IndexByte(host, ':') < 0 {
			return p, fmt.Errorf("%w: url %q: [%s] is not an IPv6 address", ErrPattern, pattern, host)
		}
		if c+1 < len(auth) {
			port = auth[c+2:]
		}
	} else if c := strings.LastIndexByte(auth, ':'); c >= 0 {
		host, port = auth[:c], auth[c+1:]
	}
	switch {
	case host == "*":
	case strings.HasPrefix(host, "*."):
		h, err := NormalizeHost(host[2:])
		if err != nil {
			return p, fmt.Errorf("%w: url %q: %w", ErrPattern, pattern, err)
		}
		p.host, p.subdomain = h, true
	default:
		h, err := NormalizeHost(host)
		if err != nil {
			return p, fmt.Errorf("%w: url %q: %w", ErrPattern, pattern, err)
		}
		p.host = h
	}
	switch {
	case port == "*":
	case port == "":
		if p.scheme != "" {
			p.port = defaultPort(p.scheme)
		}
	default:
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return p, fmt.Errorf("%w: url %q: port %q", ErrPattern, pattern, port)
		}
		p.port = int(n)
	}
	g, err := CompilePathGlob(pth, PathOptions{})
	if err != nil {
		return p, fmt.Errorf("%w: url %q: %w", ErrPattern, pattern, err)
	}
	p.path = g
	return p, nil
}

// String returns the pattern as written.
func (p URLPattern) String() string { return p.raw }

// Match reports whether the normalized URL u matches. It does not
// allocate.
func (p URLPattern) Match(u URL) bool {
	if p.scheme != "" && p.scheme != u.Scheme {
		return false
	}
	if p.port >= 0 && p.port != u.Port {
		return false
	}
	if p.host != "" {
		if p.subdomain {
			if len(u.Host) <= len(p.host)+1 || !strings.HasSuffix(u.Host, p.host) || u.Host[len(u.Host)-len(p.host)-1] != '.' {
				return false
			}
		} else if p.host != u.Host {
			return false
		}
	}
	return p.path.Match(u.Path)
}
