package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// graderTasks writes a tasks file with one task per metric.
func graderTasks(t *testing.T, metrics ...string) string {
	t.Helper()
	var entries []map[string]any
	for _, m := range metrics {
		entries = append(entries, map[string]any{"task_id": "t-" + m, "domain": "os", "config": map[string]any{
			"id": "t-" + m, "instruction": "x", "config": []any{},
			"evaluator": map[string]any{"func": m, "result": map[string]any{"type": "rule", "rules": "a"},
				"expected": map[string]any{"type": "rule", "rules": map[string]any{"expected": "a"}}},
		}})
	}
	data, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tasks.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGraderCheck(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to run the fixture checkout's evaluators")
	}
	checkout := filepath.Join("..", "..", "desktop", "osworld", "grade", "testdata", "osworld")
	cache := t.TempDir()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{name: "every task can be graded", wantCode: 0,
			args:       []string{"--osworld", checkout, "--python", python, "--cache-dir", cache, "--tasks", graderTasks(t, "exact_match", "options_match")},
			wantStdout: []string{"python:", "runs ", "missing Python modules: legato_fixture_module_that_does_not_exist (1)", "tasks: 2 checked, 0 would be refused; their metrics would run 2 through Python, 0 natively"}},
		{name: "a task would be refused", wantCode: 1,
			args:       []string{"--osworld", checkout, "--python", python, "--cache-dir", cache, "--grader", "native", "--tasks", graderTasks(t, "exact_match", "needs_missing_dependency")},
			wantStdout: []string{"run 0 through Python, 1 natively", `refused: task t-needs_missing_dependency: metric "needs_missing_dependency"`},
			wantStderr: []string{"legato rl grader: 1 of 2 tasks would be refused"}},
		{name: "native only", wantCode: 1,
			args:       []string{"--tasks", graderTasks(t, "exact_match", "options_match"), "--osworld", checkout, "--grader", "native-only"},
			wantStdout: []string{"grading natively only", "native-only grading"},
			wantStderr: []string{"1 of 2 tasks would be refused"}},
		{name: "json", wantCode: 0,
			args:       []string{"--osworld", checkout, "--python", python, "--cache-dir", cache, "--json"},
			wantStdout: []string{`"missing": "legato_fixture_module_that_does_not_exist"`, `"via": "python"`}},
		{name: "bridge without a checkout", wantCode: 2, args: []string{"--grader", "bridge"},
			wantStderr: []string{"give the checkout with --osworld"}},
		{name: "bad mode", wantCode: 2, args: []string{"--grader", "python"}, wantStderr: []string{"--grader"}},
		{name: "no such interpreter", wantCode: 1, args: []string{"--osworld", checkout, "--python", "legato-no-python"},
			wantStderr: []string{"legato-no-python"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), append([]string{"rl", "grader"}, tt.args...), &stdout, &stderr)
			if code := exitCode(t.Context(), err, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d (%v)", code, tt.wantCode, err)
			}
			for _, s := range tt.wantStdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout does not say %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr.String())
				}
			}
		})
	}
}
