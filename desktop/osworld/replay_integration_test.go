//go:build integration

package osworld

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var itReplayAttempts = flag.Int("osworld.replay.attempts", 4, "attempts TestIntegrationRewardChecks records and replays (the issue's measure: 20)")

// TestIntegrationRewardChecks records attempts of the test guest's tasks
// from their golden states and replays them without a model on the same
// pool: each starts from the golden state of the same key, its screens
// compare with the recorded ones step by step, and its reward comes out
// the same. With -osworld.replay.attempts=20 it is the measure.
// Then, on the same VMs, a task whose grader is made nondeterministic is
// caught by grading twice, quarantined, and skipped by the next batch.
func TestIntegrationRewardChecks(t *testing.T) {
	cfg := itConfig(t, "legato-itosw-replay-")
	cfg.Golden = GoldenConfig{Max: 4}
	ctx := t.Context()
	p, all := itPool(t, cfg, filepath.Join("testdata", "tasks", "guest_tasks.json"))
	// The replays and the grader checks run on the collect's VMs: a replay
	// then loads the golden state the attempt it replays took.
	k := keepDesktops(t, p)
	byID := map[string]desktop.Task{}
	for _, tk := range all {
		byID[tk.ID] = tk
	}
	ids := []string{"legato-term-echo", "legato-notes-type"}
	if *itReplayAttempts > 8 {
		ids = append(ids, "legato-home-clean", "legato-infeasible")
	}
	var tasks []desktop.Task
	for _, id := range ids {
		tasks = append(tasks, byID[id])
	}
	group := max(*itReplayAttempts/len(tasks), 1)
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
	defer srv.Close()

	out := t.TempDir()
	start := time.Now()
	if _, err := rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-replay"}, rl.CollectOptions{
		Out: out, NewDesktop: k.New, Desktops: 2, Group: group, MaxSteps: 4, EnvRetries: -1, Logger: cfg.Logger,
	}); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	collectS := time.Since(start).Seconds()
	golden := 0
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		if r.Env != nil && r.Env.Golden != "" {
			golden++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if golden == 0 {
		t.Fatalf("no attempt recorded the golden state it started from")
	}

	start = time.Now()
	rep, err := rl.Replay(ctx, out, rl.ReplayOptions{NewDesktop: k.New, Desktops: 2, Tasks: tasks, Logger: cfg.Logger})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	replayS := time.Since(start).Seconds()
	fromGolden := 0
	for _, a := range rep.Attempts {
		if a.Golden != "" {
			fromGolden++
		}
		if a.Error != "" || !a.RewardAgrees {
			t.Errorf("%s (%s): reward %s replayed as %s, error %q", a.RolloutID, a.TaskID, fmtReward(a.RecordedReward), fmtReward(a.ReplayedReward), a.Error)
		}
		for _, s := range a.Screens {
			if !s.Identical {
				t.Logf("%s (%s) step %d: the screen differs in %.3f%% of its pixels (recorded %s, replayed %s)", a.RolloutID, a.TaskID, s.Step, 100*s.Distance, s.Recorded[:12], s.Replayed[:12])
			}
		}
	}
	if fromGolden != golden {
		t.Errorf("%d replays started from the recorded golden state, want %d", fromGolden, golden)
	}
	share := float64(rep.ScreensIdentical) / float64(max(rep.Screens, 1))
	t.Logf("replayed %d attempts (%d from golden states): rewards agree on %d; %d of %d screens identical (%.1f%%); replay %.1f s per attempt vs %.1f s recorded (wall: collect %.0f s, replay %.0f s)",
		len(rep.Attempts), fromGolden, rep.RewardsAgree, rep.ScreensIdentical, rep.Screens, 100*share,
		rep.ReplayS/float64(len(rep.Attempts)), rep.RecordedS/float64(len(rep.Attempts)), collectS, replayS)
	if len(rep.Attempts) != len(tasks)*group {
		t.Errorf("%d attempts replayed, want %d", len(rep.Attempts), len(tasks)*group)
	}
	if share < 0.95 {
		t.Errorf("%.1f%% of the screens replayed identical, want at least 95%%", 100*share)
	}

	gradeTwiceOnGuest(t, k, byID["legato-term-echo"], cfg)
}

// gradeTwiceOnGuest runs a task whose grader answers yes, then no, on every
// end state (a counter in the guest's /tmp, which each reset restores):
// grading twice catches it, the task is quarantined with its evidence, and
// the next batch sharing the quarantine skips it.
func gradeTwiceOnGuest(t *testing.T, k *keptDesktops, base desktop.Task, cfg Config) {
	ctx := t.Context()
	flaky := base
	flaky.ID = "legato-flaky-grader"
	flaky.Raw = nil
	flaky.Evaluator = json.RawMessage(`{"func": "check_include_exclude",
		"result": {"type": "vm_command_line", "shell": true,
			"command": "n=$(cat /tmp/legato-grades 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/legato-grades; if [ $((n % 2)) = 1 ]; then echo yes; else echo no; fi"},
		"expected": {"type": "rule", "rules": {"include": ["yes"], "exclude": []}}}`)
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
	defer srv.Close()
	shared := filepath.Join(t.TempDir(), "quarantine.json")
	pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-flaky"}
	opts := rl.CollectOptions{Out: t.TempDir(), NewDesktop: k.New, Desktops: 1, Group: 2, MaxSteps: 4, EnvRetries: -1,
		GradeTwice: 1, Quarantine: shared, Logger: cfg.Logger}
	sum, err := rl.Collect(ctx, []desktop.Task{flaky}, pol, opts)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if n := sum.GraderDisagreements[flaky.ID]; n != 2 || sum.Quarantined[flaky.ID] != schema.QuarantineGraderDisagrees {
		t.Errorf("grading twice: %d disagreements, quarantined %v; want 2 and the task for %s", n, sum.Quarantined, schema.QuarantineGraderDisagrees)
	}
	if _, err := schema.ReadRunRecords(opts.Out, func(r schema.Record) error {
		if g := r.SecondGrade; g == nil || g.Reward == nil || *g.Reward != 0 || *r.Reward != 1 || g.Agrees {
			t.Errorf("%s: reward %s, second grade %+v; want 1, then 0, disagreeing", r.RolloutID, fmtReward(r.Reward), g)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	opts.Out = t.TempDir()
	sum, err = rl.Collect(ctx, []desktop.Task{flaky}, pol, opts)
	if err != nil || len(sum.QuarantineSkipped) != 1 || sum.Records != 0 {
		t.Errorf("the next batch: %v, skipped %v, %d records; want the task skipped, no record", err, sum.QuarantineSkipped, sum.Records)
	}

	// tasks check before a batch, on the guest: each task reset twice and
	// its start state graded twice each time. The steady task is fit; the
	// flaky grader is caught without an attempt.
	probes, err := rl.ProbeTasks(ctx, []desktop.Task{base, flaky}, rl.ProbeTasksOptions{NewDesktop: k.New, Logger: cfg.Logger})
	if err != nil {
		t.Fatalf("ProbeTasks: %v", err)
	}
	for _, pr := range probes {
		t.Logf("tasks check %s: resets %.1f s and %.1f s; unfit: %q (%s)", pr.TaskID, pr.Runs[0].ResetS, pr.Runs[1].ResetS, pr.Reason, pr.Evidence)
	}
	if pr := probes[0]; pr.Reason != "" {
		t.Errorf("tasks check found %s unfit: %s (%s)", pr.TaskID, pr.Reason, pr.Evidence)
	}
	if pr := probes[1]; pr.Reason != schema.QuarantineGraderDisagrees {
		t.Errorf("tasks check of %s: %q (%s), want %s", pr.TaskID, pr.Reason, pr.Evidence, schema.QuarantineGraderDisagrees)
	}
}
