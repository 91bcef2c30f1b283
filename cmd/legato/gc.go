package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/vm"
)

// runGC is `legato rl gc`: it lists the VMs, overlays and ports a crashed
// batch left behind, and removes them. collect sweeps them at its start
// too; gc is for a host where no batch will run soon.
func runGC(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var ow osworld.Flags
	fs := flag.NewFlagSet("legato rl gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ow.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q; all options are flags", fs.Args())
	}
	// gc needs only where the VMs live and what they are called, not an
	// image or guests to run tasks on.
	cfg := osworld.Config{
		VM: vm.Config{
			URI:        ow.LibvirtURI,
			NamePrefix: ow.NamePrefix,
			OverlayDir: ow.OverlayDir,
			Logger:     slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
	}
	return osworld.GC(ctx, cfg, stdout)
}
