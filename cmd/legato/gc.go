package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/vm"
)

// gcCommand is `legato rl gc`: it lists the VMs, overlays and ports a
// crashed batch left behind, and removes them. collect sweeps them at its
// start too; gc is for a host where no batch will run soon.
type gcCommand struct {
	// vm holds only where the VMs live and what they are called: gc needs
	// no image or guests to run tasks on.
	vm vm.Config
}

func (c *gcCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("legato rl gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerVMPlace(fs, &c.vm)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: legato rl gc [--libvirt-uri URI] [--vm-prefix PREFIX] [--overlay-dir DIR]

Removes the VMs (domains, overlays, console logs) whose names start with the
prefix, which a crashed batch left behind, and lists what it removed. It
removes running VMs too: run it when no batch of that prefix is going on.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs
}

// Run parses args and removes the leftovers.
func (c *gcCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	c.vm.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return osworld.GC(ctx, osworld.Config{VM: c.vm}, stdout)
}
