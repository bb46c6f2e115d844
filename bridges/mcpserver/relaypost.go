package mcpserver

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// poster sends the relay's POSTs to a plain-HTTP endpoint on connections
// of its own, writing each request with one Write and reading its
// response on the calling goroutine (http.ReadResponse): net/http's
// client hands every request to a connection's writer goroutine and
// every response back from its reader goroutine, two goroutine switches
// each way on a path that is one local hop, and builds and canonicalizes
// a header map per request. Connections are kept idle for reuse, one
// per request in flight (a call waiting for an elicitation's answer
// holds its own while the answer goes on another), for at most
// posterIdle, well under the daemon's idle timeout (a minute), so that a
// kept connection is not one the server is closing.
type poster struct {
	addr string // host:port
	// head is the request's first lines, up to the session's headers:
	// request line, Host, Authorization, Content-Type, Accept.
	head []byte

	mu   sync.Mutex
	idle []*postConn
}

// posterIdle is how long the poster keeps an idle connection.
const posterIdle = 30 * time.Second

type postConn struct {
	net.Conn
	br   *bufio.Reader
	buf  []byte // the request being written, reused
	used time.Time
}

// newPoster returns a poster for u, or nil when u is not plain HTTP.
func newPoster(u *url.URL, token string) *poster {
	if u == nil || u.Scheme != "http" || u.User != nil {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	head := "POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
	return &poster{addr: addr, head: []byte(head)}
}

// post sends msg with the session's headers (session and version, when
// not empty) and returns the response, whose body must be read to its
// end and closed: the connection is then kept for the next request,
// unless the response said to close it or was not read whole. ctx's end
// closes the connection.
func (p *poster) post(ctx context.Context, msg []byte, session, version string) (*http.Response, error) {
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	b := append(c.buf[:0], p.head...)
	if session != "" {
		b = append(append(append(b, "Mcp-Session-Id: "...), session...), "\r\n"...)
	}
	if version != "" {
		b = append(append(append(b, "Mcp-Protocol-Version: "...), version...), "\r\n"...)
	}
	b = append(strconv.AppendInt(append(b, "Content-Length: "...), int64(len(msg)), 10), "\r\n\r\n"...)
	b = append(b, msg...)
	c.buf = b
	stop := context.AfterFunc(ctx, func() { c.Close() })
	if _, err := c.Write(b); err != nil {
		stop()
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		stop()
		c.Close()
		return nil, err
	}
	resp.Body = &postBody{ReadCloser: resp.Body, p: p, c: c, stop: stop, keep: !resp.Close, eof: resp.ContentLength == 0}
	return resp, nil
}

// conn returns an idle connection, or a new one.
func (p *poster) conn(ctx context.Context) (*postConn, error) {
	now := time.Now()
	p.mu.Lock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(c.used) < posterIdle {
			p.mu.Unlock()
			return c, nil
		}
		c.Close()
	}
	p.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &postConn{Conn: nc, br: bufio.NewReaderSize(nc, 16<<10)}, nil
}

// put keeps c for the next request.
func (p *poster) put(c *postConn) {
	c.used = time.Now()
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// close closes the idle connections.
func (p *poster) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		c.Close()
	}
	p.idle = nil
}

// postBody is a response's body: closed once read to its end, it gives
// its connection back to the poster.
type postBody struct {
	io.ReadCloser
	p    *poster
	c    *postConn
	stop func() bool
	keep bool
	eof  bool
	done bool
}

func (b *postBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *postBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.ReadCloser.Close()
	// The connection is reusable only if the body was read whole (its
	// end seen) and ctx did not close it meanwhile.
	if b.stop() && b.keep && b.eof && err == nil {
		b.p.put(b.c)
	} else {
		b.c.Close()
	}
	return err
}
