package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	rl "legato/rl"
	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/grade"
)

// runGrader is `legato rl grader`: it says, before any VM starts, which
// Python would run OSWorld's evaluators, which metrics and getters import
// (and why not), which run natively, and which tasks would be refused.
func runGrader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("legato rl grader", stderr)
	var (
		cfg      grade.CheckConfig
		mode     string
		tasks    string
		asJSON   bool
		cacheDir string
	)
	fs.StringVar(&cfg.OSWorldDir, "osworld", "", "OSWorld checkout whose evaluators would run (none: native grading only)")
	fs.StringVar(&cfg.Python, "python", grade.DefaultPython, "Python with the packages OSWorld's evaluators import")
	fs.StringVar(&mode, "grader", "auto", "where metrics run: auto (OSWorld's Python with --osworld, else native), bridge, native (Go where implemented, Python for the rest), native-only")
	fs.StringVar(&tasks, "tasks", "", "tasks file to check, as collect takes it: its tasks that would be refused make the exit status 1")
	fs.StringVar(&cacheDir, "cache-dir", "", "collect's cache directory, where the checkout's compiled evaluators are kept (default: legato/osworld in the user cache directory)")
	fs.BoolVar(&asJSON, "json", false, "write the report as JSON")
	setUsage(fs, `Usage: legato rl grader [--osworld DIR] [--python PY] [--tasks FILE] [flags]

Says what will grade where, before any VM starts: which Python runs
OSWorld's evaluators, which metrics and getters import with it (and the
module each lacks), which run natively, and, with --tasks, which tasks a
batch would refuse. It starts one Python process, which imports every
evaluator module as a batch's grader workers do. Exit status: 0 when every
task can be graded, 1 when some would be refused, 2 for a bad command line.

`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q; all options are flags", fs.Args())
	}
	switch mode {
	case "", "auto":
		if cfg.OSWorldDir == "" {
			cfg.Mode = grade.NativeOnly
		}
	default:
		m, err := grade.ParseMode(mode)
		if err != nil {
			return usageErrorf("--grader: %v (or auto)", err)
		}
		if m != grade.NativeOnly && cfg.OSWorldDir == "" {
			return usageErrorf("--grader %s runs OSWorld's Python evaluators: give the checkout with --osworld, or use --grader native-only", mode)
		}
		cfg.Mode = m
	}
	if cacheDir == "" {
		cacheDir = osworld.DefaultCacheDir()
	}
	cfg.BytecodeDir = filepath.Join(cacheDir, "pycache")
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if tasks != "" {
		ts, err := rl.LoadTasks(tasks, rl.LoadOptions{OSWorldDir: cfg.OSWorldDir})
		if err != nil {
			return err
		}
		cfg.Tasks = ts
	}
	rep, err := grade.Check(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if n := len(rep.Refused()); n > 0 {
		return fmt.Errorf("%d of %d tasks would be refused", n, len(rep.Tasks))
	}
	return nil
}
