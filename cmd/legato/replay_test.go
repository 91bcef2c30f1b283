package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rl "legato/rl"
)

// TestReplayCLI collects a batch on the fake backend and replays two of its
// attempts, then all: every screen and reward reproduces, the report is in
// DIR/replay.json; a rollout id not in the run and a flag replay does not
// take are usage errors.
func TestReplayCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"rl", "collect", "--out", dir, "--fake-speed", "none", "--desktops", "4", "--group", "2"}, &stdout, &stderr); err != nil {
		t.Fatalf("collect: %v\n%s", err, stderr.String())
	}
	recs := readRecordsCLI(t, dir)
	stdout.Reset()
	if err := run(t.Context(), []string{"rl", "replay", dir, recs[0], recs[1], "--fake-speed", "none", "--desktops", "2"}, &stdout, &stderr); err != nil {
		t.Fatalf("replay: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "replayed 2 of 2 attempts: rewards agree on 2 (100%)") {
		t.Errorf("replay of two attempts says:\n%s", stdout.String())
	}
	stdout.Reset()
	if err := run(t.Context(), []string{"rl", "replay", dir, "--all", "--fake-speed", "none"}, &stdout, &stderr); err != nil {
		t.Fatalf("replay --all: %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, rl.ReplayFile))
	if err != nil {
		t.Fatal(err)
	}
	var rep rl.ReplayReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 12 || rep.RewardsAgree != 12 || rep.Screens == 0 || rep.ScreensIdentical != rep.Screens {
		t.Errorf("replay.json: %d replayed, %d rewards agree, %d of %d screens identical; want 12, 12, all", rep.Replayed, rep.RewardsAgree, rep.ScreensIdentical, rep.Screens)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{dir, "no-such-rollout", "--fake-speed", "none"}, `no rollout "no-such-rollout"`},
		{[]string{dir, "--policy-url", "http://127.0.0.1:1/v1"}, "flag provided but not defined: -policy-url"},
		{[]string{dir, recs[0], "--all"}, "give rollout ids or --all, not both"},
		{[]string{}, "missing run directory"},
	} {
		err := run(t.Context(), append([]string{"rl", "replay"}, tt.args...), &stdout, &stderr)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("replay %q: %v, want a usage error saying %q", tt.args, err, tt.want)
		}
	}
}

func readRecordsCLI(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rollouts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r struct {
			ID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}
