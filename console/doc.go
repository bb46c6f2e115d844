// Package console is keel's web console: static pages (HTML, CSS and
// plain JavaScript modules) embedded in the binary with go:embed, served
// by the daemon beside the protocol's WebSocket. The pages hold no data
// and need no network beyond the daemon: no CDN, no framework, no build
// step. Everything they show comes over the authenticated WebSocket in
// the documented protocol (docs/protocol.md), so the console can do
// nothing another client could not; logging in (the one-time code of
// `keel open` exchanged for a session cookie) belongs to package ipc.
//
// Handler serves the assets with a strict Content-Security-Policy (only
// the daemon's own origin for scripts, styles and the WebSocket; no
// framing), nosniff and no referrer. The pages escape everything the
// daemon sends: they build the DOM with textContent, never innerHTML.
package console
