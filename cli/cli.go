package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

// Main runs the keel command line with args (without the program name)
// and returns the exit code. extra commands (such as `keel daemon`, which
// lives in the composition root) are added to the root command.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...*cobra.Command) int {
	root := newRoot()
	for _, c := range extra {
		if c.Args != nil {
			// A wrong argument count is a usage error whichever package
			// made the command.
			c.Args = usageArgs(c.Args)
		}
		root.AddCommand(c)
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "keel:", describe(ee.err))
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "keel:", describe(err))
	return exitCode(err)
}

// describe turns protocol errors into a message for a person.
func describe(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Message
	}
	return err.Error()
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "keel",
		Short:         "keel: a local agent runtime",
		Version:       versionLine(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          unknownSubcommand,
		RunE:          groupHelp,
		Long: `keel runs agents on your machine: models through Ollama, tools as sandboxed
WebAssembly, every run journaled and traced in SQLite.

Start the runtime with 'keel daemon'; the other commands talk to it.`,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().String("data-dir", "", "keel data directory (default "+client.DefaultDataDir()+")")
	root.AddCommand(runCmd(), runsCmd(), showCmd(), traceCmd(), pauseCmd(), resumeCmd(), cancelCmd(), decideCmd(), approvalCmd(true), approvalCmd(false), sayCmd(), declassifyCmd(), takeOverCmd(), handBackCmd(), forkCmd(), replayCmd(), toolsCmd(), attachCmd(), modelsCmd(), policyCmd(), doctorCmd(), openCmd(), tokenCmd(), knowledgeCmd(), withMCPServers(mcpCmd()), acpCmd(), versionCmd())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: ExitUsage, err: err} })
	return root
}

// group makes cmd a command group: run with no arguments it prints its
// help; with an argument that names none of its subcommands it exits
// with ExitUsage and suggests the nearest names ("did you mean"), where
// cobra alone would print the help and exit 0.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = unknownSubcommand
	cmd.RunE = groupHelp
	return cmd
}

// unknownSubcommand is the Args of a command group: any argument is a
// subcommand it does not have.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t") + "\n"
	}
	return &exitError{code: ExitUsage, err: fmt.Errorf("%s\nRun '%s --help' for usage", msg, cmd.CommandPath())}
}

// groupHelp is the RunE of a command group run without a subcommand.
func groupHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }

// usageArgs makes an argument-count error exit with ExitUsage.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())}
		}
		return nil
	}
}

func dataDir(cmd *cobra.Command) string {
	dir, _ := cmd.Flags().GetString("data-dir")
	if dir == "" {
		dir = client.DefaultDataDir()
	}
	return dir
}

// withClient connects to the daemon, runs f with the client and closes it.
func withClient(cmd *cobra.Command, f func(c *client.Client) error) error {
	c, err := connect(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// call is a command that makes one request: it connects to the daemon,
// calls m with p and, if that succeeds, has show print the result, then
// closes the connection. An error of the call or of show is the
// command's.
func call[P, R any](cmd *cobra.Command, m client.Method[P, R], p P, show func(r R) error) error {
	return withClient(cmd, func(c *client.Client) error {
		r, err := client.Do(cmd.Context(), c, m, p)
		if err != nil {
			return err
		}
		return show(r)
	})
}

// jsonFlag returns the value of a flag that must hold JSON, or nil when
// it is empty; a value that is not JSON is a usage error.
func jsonFlag(name, value string) (json.RawMessage, error) {
	if value == "" {
		return nil, nil
	}
	if !json.Valid([]byte(value)) {
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--%s must be JSON", name)}
	}
	return json.RawMessage(value), nil
}

// connect dials the daemon of the command's data dir and introduces the
// CLI (initialize).
func connect(cmd *cobra.Command) (*client.Client, error) {
	c, err := client.DialDataDir(cmd.Context(), dataDir(cmd))
	if err != nil {
		return nil, err
	}
	if _, err := c.Initialize(cmd.Context(), protocol.InitializeParams{Client: "keel-cli"}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
