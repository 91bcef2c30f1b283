package profile

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"legato/rl/export/internal/cli"
	"legato/rl/schema"
)

// Main is `legato rl profile DIR [--html FILE]`: it prints the run's
// report on stdout and, with --html, writes the HTML page too.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	htmlPath := fs.String("html", "", "also write a self-contained HTML page (timeline, phases, latency histogram) to `FILE`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: legato rl profile DIR [--html FILE]

Reports where the batch in the run directory DIR spent its time: attempts by
status, success rate, time by phase and how long the model server sat idle
in each, model-call latency, prefix-cache hit rate, and per-desktop use.

Flags:
`)
		fs.PrintDefaults()
	}
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	dir, err := cli.OneDir(pos, "profile")
	if err != nil {
		return err
	}
	if *htmlPath != "" {
		if err := schema.CheckOutput(dir, *htmlPath); errors.Is(err, schema.ErrRunFile) {
			return cli.Usagef("profile: --html %v", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rep, err := Build(dir)
	if err != nil {
		return err
	}
	if err := WriteText(stdout, rep); err != nil {
		return err
	}
	if *htmlPath == "" {
		return nil
	}
	if err := WriteHTMLFile(*htmlPath, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", *htmlPath)
	return nil
}
