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
