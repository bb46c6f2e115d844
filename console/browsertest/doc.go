// Package browsertest holds the web console's end-to-end tests: a real
// daemon (scripted model, real tools, real SQLite) serving the console to
// a real headless Chromium driven over the DevTools protocol with
// chromedp (a pure-Go driver: no Node.js, no npm, nothing downloaded at
// test time). The tests log in, start a run, watch its events arrive,
// approve its tool call in the inbox, check the finished waterfall, and
// check that other origins and used login codes are refused; that the
// runs page, the inbox and the live page follow the daemon's changes
// without polling (an instrumented tab counts the requests a page sends
// and the timers it keeps); that two browsers with their own sessions
// watch and steer one run at once; and that logging out ends the
// session. The tests share one browser process and a pool of tabs, each
// in a browser context of its own (newTab), and run in parallel.
//
// They skip when no chromium is installed, unless CI or
// KEEL_TEST_REQUIRE_CHROMIUM is set: then a missing browser fails them.
// KEEL_CONSOLE_SCREENSHOTS=DIR writes the screenshots docs/ shows
// (console-run.png, console-approvals.png) into DIR.
//
// The package has no code of its own: it exists to build the tests, which
// start a whole daemon, once.
package browsertest
