package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/export"
)

// TestRegradeCLI: a batch keeps its end states; a regrade with the fake
// grading every feasible task 0 now changes the rewards that were 1, and
// export --rewards regraded writes the new rewards (an export of recorded
// rewards still the old ones). Regrading a run that kept nothing, and
// keeping end states on the osworld backend, are usage errors.
func TestRegradeCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"rl", "collect", "--out", dir, "--fake-speed", "none", "--desktops", "4", "--group", "2", "--fake-success", "1", "--keep-end-states"}, &stdout, &stderr); err != nil {
		t.Fatalf("collect: %v\n%s", err, stderr.String())
	}
	stdout.Reset()
	if err := run(t.Context(), []string{"rl", "regrade", dir, "--fake-speed", "none", "--fake-success", "0"}, &stdout, &stderr); err != nil {
		t.Fatalf("regrade: %v\n%s", err, stderr.String())
	}
	// 4 feasible demo tasks × 2 attempts went from 1 to 0; the scripted
	// agent gives up (FAIL) on demo-open-terminal, and the infeasible one
	// ends in DONE: both score 0 either way.
	if !strings.Contains(stdout.String(), "regraded 12 kept end states: 8 rewards changed, 0 not regraded") {
		t.Errorf("regrade says:\n%s", stdout.String())
	}
	rewards := func(extra ...string) map[float64]int {
		t.Helper()
		out := filepath.Join(t.TempDir(), "train.jsonl")
		if err := run(t.Context(), append([]string{"rl", "export", dir, "--out", out}, extra...), &stdout, &stderr); err != nil {
			t.Fatalf("export %v: %v\n%s", extra, err, stderr.String())
		}
		b, _ := os.ReadFile(out)
		n := map[float64]int{}
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var s export.Sample
			if err := json.Unmarshal(line, &s); err != nil {
				t.Fatal(err)
			}
			n[s.Reward]++
		}
		return n
	}
	if got := rewards(); got[1] == 0 {
		t.Errorf("recorded rewards %v, want some 1", got)
	}
	if got := rewards("--rewards", "regraded"); got[1] != 0 || got[0] == 0 {
		t.Errorf("regraded rewards %v, want all 0", got)
	}

	plain := filepath.Join(t.TempDir(), "plain")
	if err := run(t.Context(), []string{"rl", "collect", "--out", plain, "--fake-speed", "none", "--group", "1"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"rl", "regrade", plain, "--fake-speed", "none"},
		// A guest given by URL has no VM to keep.
		{"rl", "collect", "--out", plain, "--backend", "osworld", "--guest-url", "http://127.0.0.1:1", "--keep-end-states", "--tasks", "x.json"},
	} {
		err := run(t.Context(), args, &stdout, &stderr)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "end state") {
			t.Errorf("%q: %v, want a usage error about end states", args, err)
		}
	}
}
