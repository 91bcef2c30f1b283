package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"legato/rl/export/profile"
	"legato/rl/schema"
)

// profileCommand is `legato rl profile`: where a batch spent its time, as
// text and as a self-contained HTML page.
type profileCommand struct {
	html string
}

func (c *profileCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl profile", stderr)
	fs.StringVar(&c.html, "html", "", "also write a self-contained HTML page (timeline, phases, latency histogram) to `FILE`")
	setUsage(fs, `Usage: legato rl profile DIR [--html FILE]

Reports where the batch in the run directory DIR spent its time: attempts by
status, success rate, time by phase and how long the model server sat idle
in each, model-call latency, prefix-cache hit rate, and per-desktop use.
Flags may come before or after DIR.

`)
	return fs
}

// Run parses args, prints the report on stdout and, with --html, writes the
// HTML page too.
func (c *profileCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	dir, err := parseRunDir(fs, args)
	if err != nil {
		return err
	}
	if c.html != "" {
		if err := schema.CheckOutput(dir, c.html); errors.Is(err, schema.ErrRunFile) {
			return usageErrorf("--html %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rep, err := profile.Build(dir)
	if err != nil {
		return err
	}
	if err := profile.WriteText(stdout, rep); err != nil {
		return err
	}
	if c.html == "" {
		return nil
	}
	if err := profile.WriteHTMLFile(c.html, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", c.html)
	return nil
}
