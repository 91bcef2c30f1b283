package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/schema"
)

// TestTasksCheck: the demo tasks with one flaky grader whose disagreement
// the seed makes show: the check names it unfit and why, exits non-zero,
// and with --quarantine FILE puts it there and nothing else.
func TestTasksCheck(t *testing.T) {
	q := filepath.Join(t.TempDir(), "q.json")
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"rl", "tasks", "check", "--fake-speed", "none", "--fake-flaky", "demo-write-note", "--quarantine", q}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "1 tasks are unfit") {
		t.Errorf("tasks check: %v, want it to fail naming 1 unfit task\n%s", err, stdout.String())
	}
	for _, want := range []string{"demo-write-note: unfit, would quarantine: grader_disagrees", "demo-open-terminal: fit", "5 of 6 tasks fit, 1 unfit: put into " + q} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout does not say %q:\n%s", want, stdout.String())
		}
	}
	held, err := schema.ReadQuarantine(q)
	if err != nil {
		t.Fatal(err)
	}
	if ids := held.IDs(); len(ids) != 1 || ids[0] != "demo-write-note" {
		t.Errorf("the quarantine holds %v, want demo-write-note", ids)
	}
	stdout.Reset()
	if err := run(t.Context(), []string{"rl", "tasks", "check", "--fake-speed", "none"}, &stdout, &stderr); err != nil || !strings.Contains(stdout.String(), "6 of 6 tasks fit") {
		t.Errorf("steady demo tasks: %v\n%s", err, stdout.String())
	}
	if err := run(t.Context(), []string{"rl", "tasks", "inspect"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "want the subcommand check") {
		t.Errorf("tasks inspect: %v, want a usage error", err)
	}
}

// TestTasksCheckSolvedAtStart: a demo task whose untouched start state
// already scores 1 is named unfit as solved_at_start with the fake's
// explanation of the grade; --quarantine FILE takes it, and a batch
// sharing the file skips it.
func TestTasksCheckSolvedAtStart(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, "q.json")
	const solved = "demo-dark-mode"
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"rl", "tasks", "check", "--fake-speed", "none", "--fake-solved-at-start", solved, "--quarantine", q}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "1 tasks are unfit") {
		t.Errorf("tasks check: %v, want it to fail naming 1 unfit task\n%s", err, stdout.String())
	}
	evidence := `the untouched start state scores 1 without an action: fake: task "demo-dark-mode" is set to score 1 untouched (Reward.AtStart)`
	for _, want := range []string{solved + ": unfit, would quarantine: solved_at_start: " + evidence + "\n",
		"demo-write-note: fit (reward 0 on its start state", "5 of 6 tasks fit, 1 unfit: put into " + q} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout does not say %q:\n%s", want, stdout.String())
		}
	}
	held, err := schema.ReadQuarantine(q)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := held.Tasks[solved]; len(held.Tasks) != 1 || !ok || e.Reason != schema.QuarantineSolvedAtStart || e.Evidence != evidence {
		t.Fatalf("the quarantine holds %+v, want %s only, for %s: %s", held.Tasks, solved, schema.QuarantineSolvedAtStart, evidence)
	}
	stdout.Reset()
	stderr.Reset()
	out := filepath.Join(dir, "run")
	if err := run(t.Context(), []string{"rl", "collect", "--out", out, "--fake-speed", "none", "--group", "2", "--quarantine", q}, &stdout, &stderr); err != nil {
		t.Fatalf("collect: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String()+stderr.String(), "1 tasks were not run because a quarantine holds them ("+solved+")") {
		t.Errorf("collect --quarantine does not name the task it skipped:\n%s%s", stdout.String(), stderr.String())
	}
	if err := run(t.Context(), []string{"rl", "tasks", "check", "--fake-solved-at-start", "no-such-task"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), `--fake-solved-at-start "no-such-task": no such task in the batch`) {
		t.Errorf("tasks check with an unknown solved task: %v, want a usage error naming it", err)
	}
}
