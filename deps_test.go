package keel_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection enforces the layering described in
// docs/DESIGN.md ("Layering"): lower layers never import higher ones. It
// lists every package's transitive deps with `go list -deps` and fails on
// a forbidden edge.
func TestDependencyDirection(t *testing.T) {
	const mod = "github.com/keel-runtime/keel"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Deps " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// forbidden[pkg] lists module packages (prefixes) pkg must not depend on.
	all := []string{"capabilities", "intercept", "policy", "schema", "store", "models", "wasmtools", "engine", "telemetry", "ipc", "bridges", "console", "recall", "daemon", "cli", "cmd", "examples", "cloud"}
	except := func(allowed ...string) []string {
		var f []string
	next:
		for _, p := range all {
			for _, a := range allowed {
				if p == a {
					continue next
				}
			}
			f = append(f, p)
		}
		return f
	}
	rules := map[string][]string{
		"":             except(), // the root vocabulary imports nothing of keel
		"capabilities": except(),
		// The interception seam is imported by whoever implements or runs
		// an interceptor (store's audit trail, wasmtools, engine, models'
		// service) and
		// imports nothing of keel but the root types.
		"intercept": except(),
		// The decision point is pure: the root types, the standard library
		// golang.org/x and fsnotify (checked below), nothing else of keel.
		"policy":    except(),
		"schema":    except(),                            // a leaf over the JSON Schema library
		"store":     except("capabilities", "intercept"), // capabilities is pure data, like the root types
		"models":    except("intercept", "models", "schema"),
		"wasmtools": except("capabilities", "intercept", "schema", "wasmtools"),
		"engine":    append(except("intercept", "models", "policy", "schema", "engine"), "models/ollama", "models/scripted"),
		// Export sits beside the engine, on its trace seam (an interface of
		// its own, the same method set as engine.Tracer): the root types
		// and the policy that decides each export; the daemon wires it.
		"telemetry":    except("policy", "telemetry"),
		"ipc/protocol": except("capabilities"),
		"ipc/client":   except("capabilities", "ipc"),
		// The data directory's layout, shared by the daemon and clients.
		"ipc/datadir": except("capabilities", "ipc"),
		"ipc":         except("capabilities", "ipc"),
		"cli":         except("ipc", "capabilities", "cli", "bridges"),
		// Protocol adapters (MCP) over small interfaces of their own: the
		// root types and capabilities, never the engine, the store, the
		// tool runtime or the server they are served beside. The MCP
		// client (bridges/mcpclient) is a tool source: it checks inputs
		// with the schema leaf and runs its calls between the
		// interceptors (the audit trail), as the tool runtime does.
		"bridges": except("capabilities", "bridges", "intercept", "schema"),
		// The knowledge store's use (package recall): a tool source like
		// bridges/mcpclient (its calls between the interceptors), the
		// policy's knowledge decisions, and the service of the
		// knowledge.* methods in the protocol's wire types, never the
		// server (checked below), the engine or the store.
		"recall": except("capabilities", "intercept", "ipc", "knowledge", "models", "policy", "schema", "recall"),
		// The web console talks to the daemon only through the protocol:
		// its wire constants, never the server (checked below).
		"console": except("ipc", "capabilities"),
		// The trace waterfall's layout is pure: root types and the
		// standard library, so any client (CLI, console) can use it.
		"internal/waterfall": except(),
		// Long-term knowledge: the root types and the model layer's
		// Embedder (with what models itself imports), never the engine,
		// the store or the server that use it.
		"knowledge": except("intercept", "models", "schema"),
		// Hand-built test modules: the standard library only.
		"internal/wasmtest": except(),
		// The store seam's conformance suite: root types and the
		// standard library, so any store's tests can run it.
		"internal/storetest": except(),
		// The cloud (JetStream) side: a second store behind the engine's
		// seam and workers of the engine. It builds on the engine and
		// what the engine imports, never on the edge daemon's rooms
		// (store, daemon, cli); its composition root (cloud/cloudcmd)
		// adds the tool runtime and model providers, and its WebSocket
		// endpoint (cloud/gateway) serves keel/1 with ipc's own server.
		// Only cmd/ and bench/ import it (checked below).
		"cloud":          except("engine", "models", "intercept", "policy", "schema", "cloud"),
		"cloud/natstest": except(),
		// Routing is a pure decision over declarations: the standard
		// library only.
		"cloud/route": except(),
		// The edge's side of the cloud, which the daemon (the composition
		// root) wires in for --join: the leaf server, the declaration made
		// from env.describe (capabilities), the outbox and its label
		// filter (root types), routing. Never the engine (the daemon hands
		// it functions), the store or the cloud's workers.
		"cloud/edge":     except("capabilities", "cloud"),
		"cloud/gateway":  except("engine", "models", "intercept", "policy", "schema", "capabilities", "ipc", "cloud"),
		"cloud/cloudcmd": except("engine", "models", "intercept", "policy", "schema", "capabilities", "wasmtools", "ipc", "cloud"),
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
		rule, ok := ruleFor(rules, rel)
		if !ok {
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if !strings.HasPrefix(d, mod+"/") {
				if rel == "policy" && d != mod && strings.Contains(strings.SplitN(d, "/", 2)[0], ".") && !strings.HasPrefix(d, "golang.org/x/") && d != "github.com/fsnotify/fsnotify" && !strings.HasPrefix(d, "github.com/fsnotify/fsnotify/") {
					t.Errorf("%s imports third-party %s; it must use the standard library, golang.org/x and fsnotify only", pkg, d)
				}
				if rel == "" || rel == "capabilities" || rel == "intercept" || rel == "internal/waterfall" || rel == "internal/wasmtest" {
					if d != mod && strings.Contains(strings.SplitN(d, "/", 2)[0], ".") {
						t.Errorf("%s imports third-party %s; it must use the standard library only", pkg, d)
					}
				}
				continue
			}
			drel := strings.TrimPrefix(d, mod+"/")
			if (rel == "ipc/client" || rel == "ipc/datadir" || rel == "recall" || rel == "console" || strings.HasPrefix(rel, "console/")) && drel == "ipc" {
				t.Errorf("%s depends on the server package %s; the client speaks wire types only", pkg, d)
			}
			for _, f := range rule {
				if drel == f || strings.HasPrefix(drel, f+"/") {
					t.Errorf("%s depends on %s: forbidden by the layering in docs/DESIGN.md", pkg, d)
				}
			}
		}
	}
	if checked < 8 {
		t.Fatalf("checked only %d packages; the rules no longer match the layout", checked)
	}
	// The composition root builds every layer: it imports each of them
	// (and so is the one place that knows them all).
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		if pkg != mod+"/daemon" {
			continue
		}
		for _, layer := range []string{"store", "models", "wasmtools", "engine", "ipc"} {
			if !strings.Contains(" "+deps+" ", " "+mod+"/"+layer+" ") {
				t.Errorf("the composition root daemon does not import %s: every layer is built there", layer)
			}
		}
	}
	// Only cmd/, bench/ and cloud/ itself import cloud/; the daemon (and
	// so what imports it for tests, internal/daemontest) the edge's side
	// only, cloud/edge and the routing it uses, for --join.
	edgeSide := func(d string) bool { return d == mod+"/cloud/edge" || d == mod+"/cloud/route" }
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		if strings.HasPrefix(pkg, mod+"/cmd/") || strings.HasPrefix(pkg, mod+"/bench/") || strings.HasPrefix(pkg, mod+"/cloud/") || pkg == mod+"/cloud" {
			if pkg == mod+"/cloud/edge" || pkg == mod+"/cloud/route" {
				for _, d := range strings.Fields(deps) {
					if (d == mod+"/cloud" || strings.HasPrefix(d, mod+"/cloud/")) && !edgeSide(d) {
						t.Errorf("%s imports %s; the edge's side imports none of the cloud's workers, stores or commands", pkg, d)
					}
				}
			}
			continue
		}
		daemonSide := pkg == mod+"/daemon" || pkg == mod+"/internal/daemontest"
		for _, d := range strings.Fields(deps) {
			if daemonSide && edgeSide(d) {
				continue
			}
			if d == mod+"/cloud" || strings.HasPrefix(d, mod+"/cloud/") {
				t.Errorf("%s imports %s; only cmd/ and bench/ may (the daemon: cloud/edge and cloud/route)", pkg, d)
			}
		}
	}
	// Only cmd/ may import the composition root.
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		// bench/ programs, like end-to-end tests, start a whole daemon;
		// so does internal/daemontest, for tests only.
		if strings.HasPrefix(pkg, mod+"/cmd/") || strings.HasPrefix(pkg, mod+"/bench/") || pkg == mod+"/daemon" || pkg == mod+"/internal/daemontest" {
			continue
		}
		for _, d := range strings.Fields(deps) {
			if d == mod+"/daemon" {
				t.Errorf("%s imports the composition root daemon; only cmd/, bench/ and internal/daemontest may", pkg)
			}
		}
	}
}

// ruleFor finds the most specific rule for a package path.
func ruleFor(rules map[string][]string, rel string) ([]string, bool) {
	best, found := "", false
	for k := range rules {
		if rel == k || (k != "" && strings.HasPrefix(rel, k+"/")) {
			if !found || len(k) > len(best) {
				best, found = k, true
			}
		}
	}
	return rules[best], found
}
