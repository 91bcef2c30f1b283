package profile

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"legato/rl/export/internal/cli"
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
	if err := writeHTMLFile(*htmlPath, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", *htmlPath)
	return nil
}

// writeHTMLFile writes the page through a temp file and a rename, so a
// browser never opens half a page.
func writeHTMLFile(path string, rep *Report) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := WriteHTML(f, rep); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
