package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/schema"
)

// fixedRun is the export package's fixed run directory (its go test
// -update rewrites it).
const fixedRun = "../../export/testdata/run"

// runCopy copies the fixed run, so a test can damage or write into it.
func runCopy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tornCopy copies the fixed run and cuts a record in the middle of its last
// line, as a crash during an append leaves it.
func tornCopy(t *testing.T) string {
	t.Helper()
	dir := runCopy(t)
	f, err := os.OpenFile(filepath.Join(dir, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`{"schema":"legato.rollout/v0","rollout_id":"r-torn","status":"ok","rew`); err != nil {
		t.Fatal(err)
	}
	return dir
}

// damagedCopy copies the fixed run and cuts its line n (from 1) in half.
func damagedCopy(t *testing.T, n int) string {
	t.Helper()
	dir := runCopy(t)
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[n-1] = lines[n-1][:len(lines[n-1])/2] + "\n"
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cutShortCopy copies the fixed run with a batch.json of groups of 2 with
// 4 attempts each: group c, with one finished attempt of 2 and no record
// of its attempt 3, never ended, as a collect stopped by SIGTERM leaves it.
func cutShortCopy(t *testing.T) string {
	t.Helper()
	dir := runCopy(t)
	b := `{"task_ids":["task-a","task-b","task-c"],"group":2,"attempts_per_task":4}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, schema.BatchFile), []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sampleStdCopy copies the fixed run with a batch.json that records the
// sample std.
func sampleStdCopy(t *testing.T) string {
	t.Helper()
	dir := runCopy(t)
	b := `{"task_ids":["task-a","task-b","task-c"],"advantage_std":"sample"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, schema.BatchFile), []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestExportCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "train.jsonl")
	tests := []struct {
		name       string
		args       []string
		dir        func(t *testing.T) string
		wantStdout string
		wantStderr string // a substring
	}{
		{name: "flags after the directory", args: []string{"DIR", "--out", out, "--allow-missing-logprobs", "--allow-bad-logprobs"},
			wantStdout: "wrote 11 samples from 5 rollouts in 3 groups to " + out + " (14.6 KiB)\n",
			wantStderr: "warning: wrote 1 of 11 samples with broken logprobs as samples without logprobs, marked in their warnings (--allow-bad-logprobs)\n" +
				"warning: wrote 2 of 11 samples without logprobs (--allow-missing-logprobs)\n"},
		{name: "flags before the directory", args: []string{"-out=" + out, "--drop-constant-groups", "DIR"},
			wantStdout: "wrote 6 samples from 2 rollouts in 1 groups to " + out + " (8.6 KiB)\n" +
				"dropped 2 groups with equal rewards (5 samples)\n"},
		{name: "torn last line", args: []string{"DIR", "--out", out, "--allow-missing-logprobs", "--allow-bad-logprobs"}, dir: tornCopy,
			wantStdout: "wrote 11 samples from 5 rollouts in 3 groups to " + out + " (14.6 KiB)\n",
			wantStderr: "/run/rollouts.jsonl (a crash mid-append; collect runs its attempt again): rollouts.jsonl line 12 (offset 20429): no newline at the end"},
		// Group c, whose r-c1 has no logprobs, is left out: the export
		// needs no --allow-missing-logprobs.
		{name: "a group cut short", args: []string{"DIR", "--out", out, "--allow-bad-logprobs"}, dir: cutShortCopy,
			wantStdout: "wrote 9 samples from 4 rollouts in 2 groups to " + out + " (12.2 KiB)\n" +
				"left out 1 groups that never ended (2 samples)\n",
			wantStderr: "warning: 1 groups left out: not closed, fewer than 2 finished attempts and some attempts without a final record " +
				"(a collect stopped or crashed; resume it to finish them); --partial-groups writes them (2 samples): v7/task-c\n"},
		{name: "a group cut short, written", args: []string{"DIR", "--out", out, "--partial-groups", "--allow-missing-logprobs", "--allow-bad-logprobs"}, dir: cutShortCopy,
			wantStdout: "wrote 11 samples from 5 rollouts in 3 groups to " + out + " (14.6 KiB)\n" +
				"wrote 1 groups that never ended (--partial-groups)\n",
			wantStderr: "warning: wrote 1 groups that never ended, with advantages over the attempts they have (--partial-groups): v7/task-c\n"},
		// The batch's own std: nothing to say.
		{name: "the batch's advantage std", args: []string{"DIR", "--out", out, "--drop-constant-groups"}, dir: sampleStdCopy,
			wantStdout: "wrote 6 samples from 2 rollouts in 1 groups to " + out + " (8.6 KiB)\n" +
				"dropped 2 groups with equal rewards (5 samples)\n"},
		{name: "another advantage std", args: []string{"DIR", "--out", out, "--drop-constant-groups", "--advantage-std", "population"}, dir: sampleStdCopy,
			wantStdout: "wrote 6 samples from 2 rollouts in 1 groups to " + out + " (8.6 KiB)\n" +
				"dropped 2 groups with equal rewards (5 samples)\n",
			wantStderr: "warning: --advantage-std population: the advantages are divided by the population std, not the sample std the batch recorded (batch.json)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fixedRun
			if tt.dir != nil {
				dir = tt.dir(t)
			}
			args := append([]string(nil), tt.args...)
			for i, a := range args {
				if a == "DIR" {
					args[i] = dir
				}
			}
			var stdout, stderr bytes.Buffer
			if err := new(exportCommand).Run(t.Context(), args, &stdout, &stderr); err != nil {
				t.Fatalf("export %q: %v\nstderr: %s", args, err, stderr.String())
			}
			if diff := cmp.Diff(tt.wantStdout, stdout.String()); diff != "" {
				t.Errorf("stdout (-want +got):\n%s", diff)
			}
			if tt.wantStderr == "" && stderr.Len() > 0 || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tt.wantStderr)
			}
			if _, err := os.Stat(out); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestExportCommandRefuses checks the data-quality gates from the command
// line: the command fails (exit status 1, not a usage error), says why and
// writes nothing.
func TestExportCommandRefuses(t *testing.T) {
	tests := []struct {
		name    string
		dir     func(t *testing.T) string
		flags   []string
		wantMsg string
	}{
		{"samples with misaligned logprobs", func(*testing.T) string { return fixedRun }, nil,
			"1 of 11 samples have broken logprobs (0 null, NaN or infinite: nonfinite_logprobs; 1 not one per token id: logprobs_token_ids_mismatch), in 1 rollouts (r-b0)"},
		{"samples without logprobs", func(*testing.T) string { return fixedRun }, []string{"--allow-bad-logprobs"},
			"2 of 11 samples have no logprobs (the first: rollout r-c1 step 0)"},
		{"a record cut in the middle of the file", func(t *testing.T) string { return damagedCopy(t, 6) }, nil,
			"rollouts.jsonl line 6 (offset "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outDir := t.TempDir()
			var stdout bytes.Buffer
			args := append([]string{tt.dir(t), "--out", filepath.Join(outDir, "train.jsonl")}, tt.flags...)
			err := new(exportCommand).Run(t.Context(), args, &stdout, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("export = %v, want a failure saying %q", err, tt.wantMsg)
			}
			if code := exitCode(t.Context(), err, &bytes.Buffer{}); code != exitFailure {
				t.Errorf("exit code %d, want %d", code, exitFailure)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
			if left, _ := os.ReadDir(outDir); len(left) != 0 {
				t.Errorf("left %d files in the output directory", len(left))
			}
		})
	}
}

func TestExportCommandUsage(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantMsg string
	}{
		{"no directory", []string{"--out", "x.jsonl"}, "missing run directory"},
		{"no --out", []string{fixedRun}, "missing --out FILE"},
		{"two directories", []string{fixedRun, fixedRun, "--out", "x.jsonl"}, "want one run directory"},
		{"unknown flag", []string{fixedRun, "--out", "x.jsonl", "--inline"}, "flag provided but not defined: -inline"},
		{"out is the manifest", []string{fixedRun, "--out", fixedRun + "/batch.json"}, "is one of the run's own files (batch.json)"},
		{"image token 0", []string{fixedRun, "--out", "x.jsonl", "--image-token-id", "0"}, `invalid value "0" for flag -image-token-id: want an integer ≥ 1`},
		{"image token negative", []string{fixedRun, "--out", "x.jsonl", "--image-token-id=-5"}, `invalid value "-5" for flag -image-token-id`},
		{"advantage std", []string{fixedRun, "--out", "x.jsonl", "--advantage-std", "n-1"}, `invalid value "n-1" for flag -advantage-std: want population or sample`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := new(exportCommand).Run(t.Context(), tt.args, &stdout, &bytes.Buffer{})
			var usage *usageError
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("export %q = %v, want a usage error saying %q", tt.args, err, tt.wantMsg)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
	var stderr bytes.Buffer
	if err := new(exportCommand).Run(t.Context(), []string{"-h"}, &bytes.Buffer{}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("export -h = %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(stderr.String(), "Usage: legato rl export DIR --out FILE") {
		t.Errorf("-h printed %q, want the usage", stderr.String())
	}
}

// TestRepairCommand: export refuses a run with a damaged line and says to
// repair it; legato rl repair moves the line to the quarantine file and
// lists it, and the export then works.
func TestRepairCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS("../../export/testdata/run")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[2] = "{\"schema\":\"legato.rollout/v0\",\"roll\n"
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o666); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "train.jsonl")
	exportArgs := []string{"rl", "export", dir, "--out", out, "--allow-missing-logprobs", "--allow-bad-logprobs"}
	err = run(t.Context(), exportArgs, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "legato rl repair "+dir) {
		t.Fatalf("export of a damaged run: %v, want advice to run legato rl repair", err)
	}
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"rl", "repair", dir}, &stdout, io.Discard); err != nil {
		t.Fatalf("repair: %v", err)
	}
	if !strings.Contains(stdout.String(), "moved line 3:") || !strings.Contains(stdout.String(), schema.QuarantineFile) {
		t.Errorf("repair output does not list line 3 and the quarantine file:\n%s", stdout.String())
	}
	if err := run(t.Context(), exportArgs, io.Discard, io.Discard); err != nil {
		t.Fatalf("export after repair: %v", err)
	}
	stdout.Reset()
	if err := run(t.Context(), []string{"rl", "repair", dir}, &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "needs no repair") {
		t.Errorf("second repair: %v, %q; want nothing to do", err, stdout.String())
	}
}
