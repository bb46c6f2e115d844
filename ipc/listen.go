package ipc

import (
	"fmt"
	"net"
)

// CheckAddr reports whether the server may listen on addr (HOST:PORT): a
// loopback address or "localhost" always, any other only when
// allowNonLoopback, so that other machines reach keel only when asked
// for. A composition root calls it before any slow work.
func CheckAddr(addr string, allowNonLoopback bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w (want HOST:PORT, e.g. 127.0.0.1:7433)", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if allowNonLoopback {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s: it is not a loopback address, so other machines could reach keel; use 127.0.0.1, or pass --allow-non-loopback if you really mean it", addr)
}
