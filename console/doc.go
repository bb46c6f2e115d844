// Package console is keel's web console: static pages (HTML, CSS and
// plain JavaScript modules) embedded in the binary with go:embed, served
// by the daemon beside the protocol's WebSocket. The pages hold no data
// and need no network beyond the daemon: no CDN, no framework, no build
// step. Everything they show comes over the authenticated WebSocket in
// the documented protocol (docs/protocol.md), so the console can do
// nothing another client could not; logging in (the one-time code of
// `keel open` exchanged for a session cookie) and out (the header's Log
// out button posts to protocol.LogoutPath) belong to package ipc.
//
// The pages are live without polling: lists of runs are read once and
// kept current by runs.changed (runs.subscribe), a run's events come
// from run.subscribe, so an open page whose runs do not move sends
// nothing and runs no timer (a run page redraws its waterfall every 2 s
// only while its run is running).
//
// Handler serves the assets with a strict Content-Security-Policy (only
// the daemon's own origin for scripts, styles and the WebSocket; no
// framing), nosniff and no referrer. The pages escape everything the
// daemon sends: they build the DOM with textContent, never innerHTML.
package console
