package cli

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
)

// withMCPServers adds to `keel mcp` (the stdio MCP server, still what it
// runs without a subcommand) the commands that manage the MCP servers
// keel is a client of: add, list, remove, grant, and `serve`, the same
// as `keel mcp` alone.
func withMCPServers(mcp *cobra.Command) *cobra.Command {
	mcp.Long += `

Subcommands manage the MCP servers keel uses as tool sources (mcp.json in
the data directory; the daemon follows its changes): add, list, remove,
grant. 'keel mcp serve' is 'keel mcp'.`
	serve := &cobra.Command{Use: "serve", Short: "The same as `keel mcp`: serve the installed tools on stdin/stdout", Args: mcp.Args, RunE: mcp.RunE}
	mcp.AddCommand(serve, mcpAddCmd(), mcpListCmd(), mcpRemoveCmd(), mcpGrantCmd())
	return mcp
}

// mcpFile is the data directory's mcp.json.
func mcpFile(cmd *cobra.Command) string { return filepath.Join(dataDir(cmd), mcpfile.FileName) }

// nativeWarning is what the user reads before granting a stdio server:
// it is no sandboxed tool.
func nativeWarning(name string, command []string) string {
	return fmt.Sprintf(`MCP server %s is a stdio server: keel would run
  %s
as a NATIVE PROCESS, OUTSIDE keel's WebAssembly sandbox. It runs with your
user's permissions: it can read and change your files, reach the network
and start programs, and keel's grants and limits do not apply to it. keel
still decides, audits and labels each call of its tools, but not what the
process does. Grant it only if you trust this command as you would running
it yourself. The grant is bound to this command and its environment: any
change needs a new grant (keel mcp grant %s).
`, name, strings.Join(quoteArgs(command), " "), name)
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'\\$`") {
			a = fmt.Sprintf("%q", a)
		}
		out[i] = a
	}
	return out
}

// grantNative grants c its native process, after the warning: with
// allow (--allow-native) at once, otherwise by asking on a terminal; deny
// by default.
func grantNative(cmd *cobra.Command, name string, c *mcpfile.ServerConfig, allow bool) error {
	fmt.Fprint(cmd.ErrOrStderr(), nativeWarning(name, c.Command))
	if !allow {
		in := cmd.InOrStdin()
		if f, ok := in.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
			return &exitError{code: ExitRefused, err: fmt.Errorf("not granted: run it again with --allow-native to grant %s its native process (nothing was changed)", name)}
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "Run %s as a native process outside the sandbox? [y/N] ", name)
		answer, _ := bufio.NewReader(in).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return &exitError{code: ExitRefused, err: fmt.Errorf("not granted; nothing was changed")}
		}
	}
	c.NativeGrant = mcpfile.NativeDigest(*c)
	fmt.Fprintf(cmd.ErrOrStderr(), "granted: %s may run as a native process (%s)\n", name, c.NativeGrant)
	return nil
}

// keyValues parses repeated K=V flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--%s %q: want NAME=VALUE", flag, kv)}
		}
		out[strings.TrimSpace(k)] = v
	}
	return out, nil
}

func mcpAddCmd() *cobra.Command {
	var (
		url                         string
		headers, env, labels        []string
		stdio, allowNative, replace bool
		timeout                     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "add NAME (--url URL [--header K=V]... | [--stdio] [--env K=V]... -- COMMAND [ARG...])",
		Short: "Use an MCP server's tools: streamable HTTP by URL, or a stdio command (a native process, granted explicitly)",
		Long: `keel mcp add declares an MCP server whose tools runs may use, as
mcp-NAME-TOOL (provenance mcp:NAME/TOOL), decided by the policy, audited and
labelled like keel's own tools. It writes mcp.json in the data directory;
a running daemon connects at once.

  keel mcp add docs --url https://mcp.example.com/mcp --header "Authorization=Bearer TOKEN"
  keel mcp add everything --stdio -- npx -y @modelcontextprotocol/server-everything

A stdio server runs as a native process OUTSIDE keel's sandbox, with your
permissions: keel asks before granting it (--allow-native grants without
asking), and runs nothing without the grant.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			var command []string
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return &exitError{code: ExitUsage, err: errors.New("give the server's name before --, and its command after it")}
				}
				command = args[1:]
			} else if len(args) > 1 {
				return &exitError{code: ExitUsage, err: errors.New("a stdio server's command goes after --: keel mcp add NAME -- COMMAND [ARG...]")}
			}
			switch {
			case url != "" && (len(command) > 0 || stdio):
				return &exitError{code: ExitUsage, err: errors.New("give --url (streamable HTTP) or a command after -- (stdio), not both")}
			case url == "" && len(command) == 0:
				return &exitError{code: ExitUsage, err: errors.New("give --url URL, or --stdio -- COMMAND [ARG...]")}
			}
			c := mcpfile.ServerConfig{URL: url, Command: command, Labels: labels, TimeoutSeconds: int(timeout / time.Second)}
			var err error
			if c.Headers, err = keyValues("header", headers); err != nil {
				return err
			}
			if c.Env, err = keyValues("env", env); err != nil {
				return err
			}
			if err := c.Check(name); err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			path := mcpFile(cmd)
			f, err := mcpfile.ReadFile(path)
			if err != nil {
				return err
			}
			if _, ok := f.Servers[name]; ok && !replace {
				return fmt.Errorf("an MCP server named %s is declared already; replace it with --replace: %w", name, keel.ErrConflict)
			}
			if c.Transport() == mcpfile.TransportStdio {
				if err := grantNative(cmd, name, &c, allowNative); err != nil {
					return err
				}
			}
			if f.Servers == nil {
				f.Servers = map[string]mcpfile.ServerConfig{}
			}
			f.Servers[name] = c
			if err := os.MkdirAll(dataDir(cmd), 0o700); err != nil {
				return err
			}
			if err := mcpfile.WriteFile(path, f); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added MCP server %s (%s); its tools are mcp-%s-TOOL. `keel mcp list` shows its state.\n", name, c.Transport(), name)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&url, "url", "", "the server's streamable HTTP endpoint")
	fl.StringArrayVar(&headers, "header", nil, "an HTTP header sent to the server, NAME=VALUE (repeatable; stored in mcp.json, readable by you only)")
	fl.BoolVar(&stdio, "stdio", false, "the server is the command after -- (the default when a command is given)")
	fl.StringArrayVar(&env, "env", nil, "an environment variable of the stdio server, NAME=VALUE (repeatable)")
	fl.StringArrayVar(&labels, "label", nil, "a label of every result of the server's tools (private, secret, pii or one of your own; repeatable)")
	fl.BoolVar(&allowNative, "allow-native", false, "grant a stdio server its native process without asking (it runs OUTSIDE keel's sandbox)")
	fl.BoolVar(&replace, "replace", false, "replace a server of the same name")
	fl.DurationVar(&timeout, "timeout", 0, "bound each call of the server's tools (default 60s)")
	return cmd
}

func mcpGrantCmd() *cobra.Command {
	var allowNative bool
	cmd := &cobra.Command{
		Use:   "grant NAME",
		Short: "Grant a stdio MCP server, as mcp.json declares it now, its native process (outside the sandbox)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := mcpFile(cmd)
			f, err := mcpfile.ReadFile(path)
			if err != nil {
				return err
			}
			c, ok := f.Servers[args[0]]
			if !ok {
				return fmt.Errorf("no MCP server named %s is declared: %w", args[0], keel.ErrNotFound)
			}
			if c.Transport() != mcpfile.TransportStdio {
				return &exitError{code: ExitUsage, err: fmt.Errorf("%s is an HTTP server: it needs no native grant (the policy decides its egress)", args[0])}
			}
			if err := grantNative(cmd, args[0], &c, allowNative); err != nil {
				return err
			}
			f.Servers[args[0]] = c
			return mcpfile.WriteFile(path, f)
		},
	}
	cmd.Flags().BoolVar(&allowNative, "allow-native", false, "grant without asking (it runs OUTSIDE keel's sandbox)")
	return cmd
}

func mcpRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME",
		Short: "Stop using an MCP server (a running daemon disconnects at once)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := mcpFile(cmd)
			f, err := mcpfile.ReadFile(path)
			if err != nil {
				return err
			}
			if _, ok := f.Servers[args[0]]; !ok {
				return fmt.Errorf("no MCP server named %s is declared: %w", args[0], keel.ErrNotFound)
			}
			delete(f.Servers, args[0])
			if err := mcpfile.WriteFile(path, f); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed MCP server %s\n", args[0])
			return nil
		},
	}
}

func mcpListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the MCP servers keel uses, with their state when the daemon runs",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := mcpfile.ReadFile(mcpFile(cmd))
			if err != nil {
				return err
			}
			// The daemon's view, when one runs: state, tools, errors.
			live := map[string]capabilities.MCPServerDecl{}
			running := false
			if c, err := client.DialDataDir(cmd.Context(), dataDir(cmd)); err == nil {
				if env, err := c.Describe(cmd.Context()); err == nil {
					running = true
					for _, d := range env.MCPServers {
						live[d.Name] = d
					}
				}
				c.Close()
			}
			var decls []capabilities.MCPServerDecl
			for _, name := range slices.Sorted(maps.Keys(f.Servers)) {
				c := f.Servers[name]
				d, ok := live[name]
				if !ok {
					d = capabilities.MCPServerDecl{Name: name, Transport: c.Transport(), URL: c.URL, Command: c.Command, Labels: c.Labels, Tools: []string{},
						NativeGranted: c.Transport() == mcpfile.TransportStdio && c.Granted(), State: "daemon not running"}
					if running {
						d.State = "not loaded yet"
					}
				}
				decls = append(decls, d)
			}
			if asJSON {
				if decls == nil {
					decls = []capabilities.MCPServerDecl{}
				}
				return writeJSON(cmd, decls)
			}
			printMCPServers(cmd.OutOrStdout(), decls)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printMCPServers(out io.Writer, decls []capabilities.MCPServerDecl) {
	if len(decls) == 0 {
		fmt.Fprintln(out, "no MCP servers (add one with keel mcp add)")
		return
	}
	for _, d := range decls {
		where := d.URL
		if d.Transport == mcpfile.TransportStdio {
			where = strings.Join(quoteArgs(d.Command), " ")
			if !d.NativeGranted {
				where += "  (NOT GRANTED: keel mcp grant " + d.Name + ")"
			} else {
				where += "  (native process, outside the sandbox)"
			}
		}
		fmt.Fprintf(out, "%s  %s  %s\n  state: %s", d.Name, d.Transport, where, d.State)
		if d.Server != "" {
			fmt.Fprintf(out, " (%s)", d.Server)
		}
		fmt.Fprintln(out)
		if d.Error != "" {
			fmt.Fprintf(out, "  error: %s\n", d.Error)
		}
		if len(d.Labels) > 0 {
			fmt.Fprintf(out, "  labels: %s\n", strings.Join(d.Labels, ", "))
		}
		if len(d.Tools) > 0 {
			fmt.Fprintf(out, "  tools: %s\n", strings.Join(d.Tools, ", "))
		}
	}
}
