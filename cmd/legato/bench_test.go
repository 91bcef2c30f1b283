package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"legato/rl/export"
	"legato/rl/internal/benchrun"
)

// TestBenchCommand measures a small run: a line per export shape with its
// sizes and speeds, the commit wait of every record, the synthetic run
// reused from --dir, and no temporary directory left behind.
func TestBenchCommand(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	keep := filepath.Join(t.TempDir(), "run")
	args := []string{"--rollouts", "24", "--steps", "3", "--group", "4", "--desktops", "6", "--attempts", "12", "--server-workers", "3", "--dir", keep}
	var stdout, stderr bytes.Buffer
	if err := new(benchCommand).Run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstderr: %s", err, stderr.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "export: 24 rollouts × 3 steps, groups of 4; run generated in") {
		t.Errorf("no export header saying the run was generated:\n%s", out)
	}
	for _, shape := range []string{"steps", "prefix", "contiguous"} {
		m := regexp.MustCompile(`(?m)^  ` + shape + ` +([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9]+) +([0-9.]+) +([0-9.]+) +([0-9.]+|\+Inf) +([0-9.]+) +([0-9.]+|\+Inf)$`).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("no line for %s:\n%s", shape, out)
			continue
		}
		if mb, _ := strconv.ParseFloat(m[1], 64); mb <= 0 {
			t.Errorf("%s: %s MB written", shape, m[1])
		}
		if n, _ := strconv.Atoi(m[4]); n <= 0 {
			t.Errorf("%s: %s rollouts/s", shape, m[4])
		}
	}
	m := regexp.MustCompile(`commit: 6 instant desktops \(320x192 screens\), server workers 3, (\d+) records: wait p50 \d+ ms, p90 \d+ ms, p99 \d+ ms, max \d+ ms; \d+ graded rollouts/s`).FindStringSubmatch(out)
	if m == nil || m[1] != "12" {
		t.Errorf("commit line: %q; want 12 records:\n%s", m, out)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("bench left %d entries in TMPDIR (%s ...)", len(entries), entries[0].Name())
	}

	stdout.Reset()
	if err := new(benchCommand).Run(t.Context(), append(args, "--only", "prefix"), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if out := stdout.String(); !strings.Contains(out, "run reused "+keep) || strings.Contains(out, "  steps ") || strings.Contains(out, "commit:") {
		t.Errorf("--only prefix with a kept run: want the run reused and only the prefix shape:\n%s", out)
	}

	// --process: each export is a legato rl export (this test binary
	// running main) writing the run's 24 rollouts.
	t.Setenv(runMainEnv, "1")
	stdout.Reset()
	if err := new(benchCommand).Run(t.Context(), append(args, "--only", "export", "--process"), &stdout, &stderr); err != nil {
		t.Fatalf("bench --process: %v\nstderr: %s", err, stderr.String())
	}
	out = stdout.String()
	if !strings.Contains(out, "exports each a legato rl export process") {
		t.Errorf("--process: the header does not say the exports ran in processes:\n%s", out)
	}
	for _, shape := range []string{"steps", "prefix", "contiguous"} {
		if !regexp.MustCompile(`(?m)^  ` + shape + ` +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ `).MatchString(out) {
			t.Errorf("--process: no line for %s:\n%s", shape, out)
		}
	}
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("bench --process left %d entries in TMPDIR (%s ...)", len(entries), entries[0].Name())
	}
}

// TestExportProcess: bench --process runs the export a trainer runs, in a
// process of its own: it writes what the export in this process writes,
// and its rollouts and CPU time are the child's.
func TestExportProcess(t *testing.T) {
	t.Setenv(runMainEnv, "1") // the child, this test binary, runs main
	dir := filepath.Join(t.TempDir(), "run")
	if _, err := benchrun.Generate(dir, benchrun.Run{Rollouts: 24, Steps: 3, Group: 4, PromptIDs: true}); err != nil {
		t.Fatal(err)
	}
	for _, s := range benchShapes {
		out, in := filepath.Join(t.TempDir(), "child.jsonl"), filepath.Join(t.TempDir(), "here.jsonl")
		took, cpu, rollouts, err := exportProcess(t.Context(), dir, out, s.flags)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		st, err := export.ExportSteps(dir, in, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		child, _ := os.ReadFile(out)
		here, _ := os.ReadFile(in)
		if len(child) == 0 || !bytes.Equal(child, here) {
			t.Errorf("%s: the child wrote %d bytes, the export here %d, not the same", s.name, len(child), len(here))
		}
		if rollouts != st.Rollouts || rollouts != 24 || took <= 0 || cpu <= 0 {
			t.Errorf("%s: %d rollouts in %v (%v CPU), want %d and times", s.name, rollouts, took, cpu, st.Rollouts)
		}
	}
	if _, _, _, err := exportProcess(t.Context(), filepath.Join(t.TempDir(), "none"), filepath.Join(t.TempDir(), "x.jsonl"), nil); err == nil || !strings.Contains(err.Error(), "legato rl export") {
		t.Errorf("export of a missing run: %v, want the child's error", err)
	}
}

func TestBenchCommandErrors(t *testing.T) {
	notRun := t.TempDir()
	if err := os.WriteFile(filepath.Join(notRun, "mine.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"--steps", "0"}, "--steps 0: want a positive number", true},
		{[]string{"--desktops", "-1"}, "--desktops -1: want a positive number", true},
		{[]string{"--server-workers", "-1"}, "want an integer ≥ 0", true},
		{[]string{"--only", "json"}, `--only "json": want one of export, commit, steps, prefix, contiguous`, true},
		{[]string{"extra"}, "unexpected arguments", true},
		{[]string{"--only", "export", "--dir", notRun}, "holds files but no complete generated run", false},
	} {
		err := new(benchCommand).Run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		var usage *usageError
		if err == nil || !strings.Contains(err.Error(), tt.want) || errors.As(err, &usage) != tt.usage {
			t.Errorf("bench %q = %v; want %q (a usage error: %v)", tt.args, err, tt.want, tt.usage)
		}
	}
}
