package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"legato/rl/desktop/osworld"
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
	cfg, err := ow.Config(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	return osworld.GC(ctx, cfg, stdout)
}
