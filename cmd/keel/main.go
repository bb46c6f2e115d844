// Command keel is the keel agent runtime: `keel daemon` starts it, the
// other commands are its clients. See `keel --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/cloud/cloudcmd"
	"github.com/keel-runtime/keel/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if code, ok := daemon.CompileChild(ctx); ok {
		stop()
		os.Exit(code)
	}
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, daemon.Command(), cloudcmd.Command())
	stop()
	os.Exit(code)
}
