package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/export"
	"legato/rl/schema"
)

// TestQuarantineCLI: a batch that grades twice finds the flaky task's
// grader disagreeing, says so and quarantines it in the shared file; the
// next batch sharing it skips the task, naming it; export leaves the
// task's samples out unless --include-quarantined.
func TestQuarantineCLI(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "quarantine.json")
	first, second := filepath.Join(dir, "first"), filepath.Join(dir, "second")
	const flaky = "demo-write-note"
	collect := func(out string, extra ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args := append([]string{"rl", "collect", "--out", out, "--fake-speed", "none", "--desktops", "8", "--group", "4", "--quarantine", shared}, extra...)
		if err := run(t.Context(), args, &stdout, &stderr); err != nil {
			t.Fatalf("collect %v: %v\nstderr:\n%s", extra, err, stderr.String())
		}
		return stdout.String() + stderr.String()
	}
	out := collect(first, "--grade-twice", "--fake-flaky", flaky)
	for _, want := range []string{"graded 24 end states twice", "quarantined " + flaky + " (grader_disagrees)", "the grader gave another reward"} {
		if !strings.Contains(out, want) {
			t.Errorf("the first batch's output does not say %q:\n%s", want, out)
		}
	}
	q, err := schema.ReadQuarantine(shared)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := q.Tasks[flaky]; !ok || len(q.Tasks) != 1 {
		t.Fatalf("the shared quarantine holds %v, want %s only", q.IDs(), flaky)
	}

	out = collect(second)
	if !strings.Contains(out, "1 tasks were not run because a quarantine holds them ("+flaky+")") {
		t.Errorf("the second batch does not name the task it skipped:\n%s", out)
	}
	sum, err := schema.ReadSummary(second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.State != schema.StateComplete || len(sum.QuarantineSkipped) != 1 || sum.Counts[schema.StatusOK] != 20 {
		t.Errorf("second batch: %s, skipped %v, %d ok; want complete, %s skipped, 20 ok", sum.State, sum.QuarantineSkipped, sum.Counts[schema.StatusOK], flaky)
	}

	tasksIn := func(path string) map[string]int {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var s export.Sample
			if err := json.Unmarshal(line, &s); err != nil {
				t.Fatal(err)
			}
			n[s.TaskID]++
		}
		return n
	}
	var stdout, stderr bytes.Buffer
	samples := filepath.Join(dir, "train.jsonl")
	if err := run(t.Context(), []string{"rl", "export", first, "--out", samples}, &stdout, &stderr); err != nil {
		t.Fatalf("export: %v\n%s", err, stderr.String())
	}
	if n := tasksIn(samples); n[flaky] != 0 || len(n) != 5 {
		t.Errorf("export wrote samples of tasks %v, want the 5 not quarantined", n)
	}
	if !strings.Contains(stderr.String(), "left out 4 records of quarantined tasks ("+flaky+")") {
		t.Errorf("export does not say what it left out:\n%s", stderr.String())
	}
	if err := run(t.Context(), []string{"rl", "export", first, "--out", samples, "--include-quarantined"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if n := tasksIn(samples); n[flaky] == 0 {
		t.Errorf("--include-quarantined wrote samples of tasks %v, want %s among them", n, flaky)
	}
}
