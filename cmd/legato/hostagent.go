package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"

	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
)

// hostAgentCommand is `legato rl host-agent`: it runs on a libvirt host,
// started by a fleet over SSH, and forks golden states there for it
// (package hostagent). It speaks on stdin and stdout, and ends everything
// it made when stdin ends.
type hostAgentCommand struct {
	vm vm.Config
}

func (c *hostAgentCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl host-agent", stderr)
	fs.StringVar(&c.vm.ForkDir, "fork-dir", "", "where the templates and clones go on this host (default "+vm.DefaultForkDir+"; tmpfs or hugetlbfs)")
	fs.StringVar(&c.vm.NamePrefix, "vm-prefix", vm.DefaultNamePrefix, "the fleet's VM name prefix, which names the templates (and which templates the sweep removes)")
	setUsage(fs, `Usage: legato rl host-agent [--fork-dir DIR] [--vm-prefix PREFIX]

Runs on a libvirt host for a fleet (collect, serve) on another machine,
which starts it over its SSH connection: it takes fork templates of the
fleet's VMs on this host, so their guest RAM never crosses the network,
and starts and ends their clones. It reads requests (JSON lines) on stdin
and answers on stdout; when stdin ends (the fleet closed the session, was
killed, or lost the connection) it ends every clone and template it made
and removes their files. Run as root (it reads guest RAM out of libvirt's
QEMU). Not for interactive use.

`)
	return fs
}

// Run parses args and serves the fleet on stdin and stdout.
func (c *hostAgentCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if err := vm.CheckForkPlace(c.vm.ForkDir, c.vm.NamePrefix); err != nil {
		return usageErrorf("%v", err)
	}
	c.vm.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return hostagent.NewServer(hostagent.Local(c.vm), c.vm.Logger).Serve(ctx, os.Stdin, stdout)
}
