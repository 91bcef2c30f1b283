package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/schema"
)

// gcCommand is `legato rl gc`: it lists the VMs and their volumes a
// crashed batch left behind on each host, and removes them. collect sweeps
// them at its start too; gc is for hosts where no batch will run soon.
type gcCommand struct {
	// vm holds only where the VMs live and what they are called: gc needs
	// no image or guests to run tasks on.
	vm vm.Config
	// from is --hosts-from: the hosts are resolved once.
	from *hostdns.Source
	// endStates are run directories whose half-written kept end states
	// gc removes.
	endStates stringList
}

func (c *gcCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl gc", stderr)
	registerVMPlace(fs, &c.vm, &c.from)
	fs.StringVar(&c.vm.ForkDir, "fork-dir", "", "where --golden-fork kept its templates and clones (default "+vm.DefaultForkDir+"), here and on the remote hosts")
	fs.StringVar(&c.vm.HostAgent, "host-agent", "", "the legato `program` on remote hosts that removes the fork templates a killed host agent left there (default legato on the SSH user's PATH)")
	fs.Var(&c.endStates, "end-states", "a run `DIR` of collect --keep-end-states: remove the end states a killed batch left half-written in DIR/end-states and say what the whole ones take (repeat for several runs)")
	setUsage(fs, `Usage: legato rl gc [--host URI... | --hosts-from dns:NAME] [--vm-prefix PREFIX] [--storage-pool POOL] [--fork-dir DIR] [--host-agent PROGRAM] [--end-states DIR]...

Removes the VMs (domains, overlay and console log volumes) whose names start
with the prefix, which a crashed batch left behind, from every host, and
lists what it removed. It removes running VMs too: run it when no batch of
that prefix is going on. On this machine it also removes the fork templates
of the prefix that no running process holds, and kills their clones (on a
remote host, its host agent does, where legato is installed), and the end
states a killed batch left half-written in the runs --end-states
names (whole ones stay: collect drops the oldest past --end-states-max).

`)
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
	if err := checkVMPlace(c.vm, c.from); err != nil {
		return err
	}
	c.vm.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, dir := range c.endStates {
		if err := osworld.GCEndStates(filepath.Join(dir, schema.EndStatesDir), stdout); err != nil {
			return fmt.Errorf("--end-states %s: %w", dir, err)
		}
	}
	return osworld.GC(ctx, osworld.Config{VM: c.vm, HostsFrom: c.from}, stdout)
}
