package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

const grantHelp = `Grant specs:
  fs:/GUEST=HOSTDIR      the host directory HOSTDIR at /GUEST, read-write only if the tool asks for it
  fs-ro:/GUEST=HOSTDIR   the same, read-only whatever the tool asks
  net:PATTERN            a network destination the tool requests, e.g. net:https://api.example.com:443
  env:NAME               an environment value the tool requests
  limit:KIND=VALUE       a higher limit the tool's manifest asks for: timeout=30s, memory=512MiB,
                         output=4MiB or write_quota=2GiB
(revoke takes fs:/GUEST without the host directory, and limit:KIND without a value)
--private marks the directories granted (fs, fs-ro) private: once a run reads the output of a tool
with a private directory, the run is private from that step on and nothing reaches a cloud model.
--label NAME gives the directories granted a label of your own (pii, secret, ...; a lower-case letter,
then letters, digits, - or _; repeat it or separate with commas): a tool call that opens a file there
carries the label into the run, where the policy decides where it may go (docs/policy.md).
--label private is --private. Granting a directory again replaces its labels.`

// parseGrants turns grant specs into Grants. withHost is false for revoke.
func parseGrants(specs []string, withHost bool) (capabilities.Grants, error) {
	var g capabilities.Grants
	for _, s := range specs {
		kind, val, ok := strings.Cut(s, ":")
		if !ok || val == "" {
			return g, fmt.Errorf("grant %q: want KIND:VALUE\n%s", s, grantHelp)
		}
		switch kind {
		case "fs", "fs-ro":
			guest, host, hasHost := strings.Cut(val, "=")
			if !strings.HasPrefix(guest, "/") {
				return g, fmt.Errorf("grant %q: the guest path must start with /", s)
			}
			if withHost {
				if !hasHost || host == "" {
					return g, fmt.Errorf("grant %q: name the host directory: %s=HOSTDIR", s, kind+":"+guest)
				}
				abs, err := filepath.Abs(expandHome(host))
				if err != nil {
					return g, err
				}
				host = abs
			}
			g.FS = append(g.FS, capabilities.FSGrant{GuestPath: guest, HostPath: host, ReadOnly: kind == "fs-ro"})
		case "net":
			g.Network = append(g.Network, val)
		case "env":
			g.Env = append(g.Env, val)
		case "limit":
			l, err := capabilities.ParseLimit(val, withHost)
			if err != nil {
				return g, fmt.Errorf("grant %q: %w", s, err)
			}
			g.Limits = g.Limits.Add(l)
		default:
			return g, fmt.Errorf("grant %q: unknown kind %q\n%s", s, kind, grantHelp)
		}
	}
	return g, nil
}

// labelDirs gives every directory g grants the labels (and private,
// if private is set). The labels are checked: an error names the bad one.
func labelDirs(g capabilities.Grants, private bool, labels []string) (capabilities.Grants, error) {
	if private {
		labels = append(labels, keel.LabelPrivate)
	}
	if len(labels) == 0 {
		return g, nil
	}
	if len(g.FS) == 0 {
		return g, fmt.Errorf("--private and --label mark directories: name one with fs:/GUEST=HOSTDIR")
	}
	for i := range g.FS {
		f, err := g.FS[i].WithLabels(labels...)
		if err != nil {
			return g, fmt.Errorf("--label: %w", err)
		}
		g.FS[i] = f
	}
	return g, nil
}

// fsMode describes how f grants its directory, for people:
// "read-only", "read-write, private", "read-only, labels pii, secret".
func fsMode(f capabilities.FSGrant) string {
	mode := "read-write"
	if f.ReadOnly {
		mode = "read-only"
	}
	if f.Private {
		mode += ", private"
	}
	if len(f.Labels) > 0 {
		mode += ", labels " + strings.Join(f.Labels, ", ")
	}
	return mode
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

// describeGrants renders grants one per line, for people.
func describeGrants(w io.Writer, prefix string, g capabilities.Grants) {
	for _, f := range g.FS {
		mode := fsMode(f)
		if f.HostPath != "" {
			fmt.Fprintf(w, "%sfs  %s → %s (%s)\n", prefix, f.GuestPath, f.HostPath, mode)
		} else {
			fmt.Fprintf(w, "%sfs  %s (%s)\n", prefix, f.GuestPath, mode)
		}
	}
	for _, n := range g.Network {
		fmt.Fprintf(w, "%snet %s\n", prefix, n)
	}
	for _, e := range g.Env {
		fmt.Fprintf(w, "%senv %s\n", prefix, e)
	}
	for _, l := range g.Limits.Specs() {
		fmt.Fprintf(w, "%slimit %s\n", prefix, l)
	}
}

// describePending tells the user that a tool was replaced and what it
// takes to give the new module the grants the old one had. digest is the
// tool's grant digest (its module's sha256, covering its sidecar manifest
// if any).
func describePending(w io.Writer, prefix, name, digest string, p *capabilities.PendingGrants) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "%sreplaced: this module and manifest (grant digest %s) have none of the grants given to %s:\n", prefix, digest, p.SHA256)
	describeGrants(w, prefix+"  ", p.Grants)
	fmt.Fprintf(w, "%sto give it them: keel tools grant %s --confirm %s\n", prefix, name, digest)
}

// grantsLine renders grants on one line, for people: "none" when empty.
func grantsLine(g capabilities.Grants) string {
	var parts []string
	for _, f := range g.FS {
		parts = append(parts, fmt.Sprintf("fs %s=%s (%s)", f.GuestPath, f.HostPath, strings.Join(f.Modes(), ", ")))
	}
	for _, n := range g.Network {
		parts = append(parts, "net "+n)
	}
	for _, e := range g.Env {
		parts = append(parts, "env "+e)
	}
	for _, l := range g.Limits.Specs() {
		parts = append(parts, "limit "+l)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// ungranted lists what req asks for that g does not give.
func ungranted(req, g capabilities.Grants) capabilities.Grants {
	var out capabilities.Grants
	for _, f := range req.FS {
		if !slices.ContainsFunc(g.FS, func(x capabilities.FSGrant) bool { return x.GuestPath == f.GuestPath }) {
			out.FS = append(out.FS, f)
		}
	}
	for _, n := range req.Network {
		if !slices.Contains(g.Network, n) {
			out.Network = append(out.Network, n)
		}
	}
	for _, e := range req.Env {
		if !slices.Contains(g.Env, e) {
			out.Env = append(out.Env, e)
		}
	}
	return out
}

func installCmd() *cobra.Command {
	var specs, labels []string
	var all, replace, keep, private bool
	cmd := &cobra.Command{
		Use:   "install PATH.wasm",
		Short: "Validate, compile and install a tool, granting what you choose of what it requests",
		Long:  "Install a WebAssembly tool. Nothing is granted unless you say so.\n\n" + grantHelp,
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			g, err := parseGrants(specs, true)
			if err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			if keep && !replace {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--keep-grants carries the grants of the tool being replaced: add --replace")}
			}
			return withClient(cmd, func(c *client.Client) error {
				ctx, out, errw := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
				var info protocol.ToolInfo
				pr := newProgress(errw, isTerminal(errw), false)
				if err := pr.during("validating and compiling "+filepath.Base(file), func() (err error) {
					info, err = client.Do(ctx, c, client.ToolsInspect, protocol.ToolsInspectParams{Path: file})
					return err
				}); err != nil {
					return err
				}
				fmt.Fprintf(out, "%s %s (%s): %s\n", info.Name, info.Version, info.SideEffects, info.Description)
				if info.Requests.Empty() {
					fmt.Fprintln(out, "requests: nothing beyond its own memory, the clock and randomness")
				} else {
					fmt.Fprintln(out, "requests:")
					describeGrants(out, "  ", info.Requests)
				}
				if len(info.Labels) > 0 {
					fmt.Fprintf(out, "output labels: %s (its results carry them, whatever it reads)\n", strings.Join(info.Labels, ", "))
				}
				if all {
					g = g.Add(capabilities.Grants{Network: info.Requests.Network, Env: info.Requests.Env})
					for _, f := range info.Requests.FS {
						if !slices.ContainsFunc(g.FS, func(x capabilities.FSGrant) bool { return x.GuestPath == f.GuestPath }) {
							return &exitError{code: ExitUsage, err: fmt.Errorf("--grant-all cannot choose a host directory for %s: add --grant fs:%s=HOSTDIR", f.GuestPath, f.GuestPath)}
						}
					}
				}
				if g, err = labelDirs(g, private, labels); err != nil {
					return &exitError{code: ExitUsage, err: err}
				}
				installed, err := client.Do(context.WithoutCancel(ctx), c, client.ToolsInstall, protocol.ToolsInstallParams{Path: file, Grants: g, Replace: replace, KeepGrants: keep})
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "installed %s (sha256 %s)\n", installed.Name, installed.SHA256)
				if installed.Grants.Empty() {
					fmt.Fprintln(out, "granted: nothing")
				} else {
					fmt.Fprintln(out, "granted:")
					describeGrants(out, "  ", installed.Grants)
				}
				if missing := ungranted(installed.Requests, installed.Grants); !missing.Empty() {
					fmt.Fprintf(out, "not granted (calls that need these fail with permission_denied; grant later with `keel tools grant %s SPEC`):\n", installed.Name)
					describeGrants(out, "  ", missing)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringArrayVar(&specs, "grant", nil, "grant one capability (repeatable; see --help)")
	cmd.Flags().BoolVar(&all, "grant-all", false, "grant every network and environment request (directories still need --grant fs:…)")
	cmd.Flags().BoolVar(&replace, "replace", false, "replace an installed tool of the same name (its grants are not kept)")
	cmd.Flags().BoolVar(&private, "private", false, "mark the directories granted private (see --help)")
	cmd.Flags().StringSliceVar(&labels, "label", nil, "give the directories granted this label (repeatable; see --help)")
	cmd.Flags().BoolVar(&keep, "keep-grants", false, "with --replace: give the new module the grants of the one it replaces (those it still requests)")
	return cmd
}

func removeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME",
		Short: "Uninstall a tool and forget its grants",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, client.ToolsRemove, protocol.ToolRef{Name: args[0]}, func(client.None) error {
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", args[0])
				return nil
			})
		},
	}
}

func grantCmd() *cobra.Command {
	var confirm string
	var labels []string
	var private bool
	cmd := &cobra.Command{
		Use:   "grant NAME [SPEC...]",
		Short: "Grant an installed tool more of what it requests",
		Long: "Grant an installed tool more of what it requests.\n\n" +
			"Grants belong to a module and its manifest: when a tool's file or its sidecar NAME.manifest.json is\n" +
			"replaced, giving it another grant digest, the new tool gets none of them until you confirm, with\n" +
			"--confirm and the new grant digest (`keel tools list` shows it; without a sidecar it is the module's sha256).\n\n" + grantHelp,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if confirm == "" && len(args) < 2 {
				return &exitError{code: ExitUsage, err: fmt.Errorf("name what to grant, or confirm pending grants with --confirm GRANT_DIGEST")}
			}
			g, err := parseGrants(args[1:], true)
			if err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			if g, err = labelDirs(g, private, labels); err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			return call(cmd, client.ToolsGrant, protocol.ToolsGrantParams{Name: args[0], Grants: g, Confirm: confirm}, printGrants(cmd))
		},
	}
	cmd.Flags().BoolVar(&private, "private", false, "mark the directories granted private (see --help)")
	cmd.Flags().StringSliceVar(&labels, "label", nil, "give the directories granted this label (repeatable; see --help)")
	cmd.Flags().StringVar(&confirm, "confirm", "", "give the installed tool, of this grant digest, the grants its name had before it was replaced")
	return cmd
}

func revokeCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "revoke NAME [SPEC...]",
		Short: "Take grants back from a tool (--all for every grant)",
		Long:  "Take grants back from a tool.\n\n" + grantHelp,
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 1) {
				return &exitError{code: ExitUsage, err: fmt.Errorf("name the grants to revoke, or pass --all (not both)")}
			}
			g, err := parseGrants(args[1:], false)
			if err != nil {
				return &exitError{code: ExitUsage, err: err}
			}
			return call(cmd, client.ToolsRevoke, protocol.ToolsRevokeParams{Name: args[0], Grants: g, All: all}, printGrants(cmd))
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "revoke every grant")
	return cmd
}

// printGrants prints the grants a tool has after keel tools grant or
// revoke.
func printGrants(cmd *cobra.Command) func(protocol.ToolInfo) error {
	return func(info protocol.ToolInfo) error {
		out := cmd.OutOrStdout()
		if info.Grants.Empty() {
			fmt.Fprintf(out, "%s now has no grants\n", info.Name)
			return nil
		}
		fmt.Fprintf(out, "%s now has:\n", info.Name)
		describeGrants(out, "  ", info.Grants)
		return nil
	}
}
