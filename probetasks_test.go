package rl

import (
	"fmt"
	"path/filepath"
	"testing"
	"testing/synctest"

	"legato/rl/desktop/fake"
	"legato/rl/schema"
)

// TestProbeTasks tries tasks on fake desktops: steady ones are fit, a task
// whose setup fails is unfit for it, and flaky graders (a second grade
// draws anew, so about half of them disagree on their one start state) are
// found; with a quarantine file the unfit tasks go into it.
func TestProbeTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(11)
		cfg := fake.Config{Width: testWidth, Height: testHeight, Seed: 9, DefaultReward: fake.Reward{P: 0.5},
			Rewards: map[string]fake.Reward{},
			Faults:  []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, Prob: 1, Task: "t2"}}}
		flaky := map[string]bool{}
		for i := 3; i < 11; i++ {
			id := fmt.Sprintf("t%d", i)
			flaky[id] = true
			cfg.Rewards[id] = fake.Reward{P: 0.5, Flaky: true}
		}
		fleet := fake.NewFleet(cfg)
		qfile := filepath.Join(t.TempDir(), "q.json")
		probes, err := ProbeTasks(t.Context(), tasks, ProbeTasksOptions{NewDesktop: fleet.New, Desktops: 3, Quarantine: qfile})
		if err != nil {
			t.Fatal(err)
		}
		checkClosed(t, fleet)
		flagged := 0
		for _, p := range probes {
			switch {
			case p.TaskID == "t2":
				if p.Reason != schema.QuarantineSetupFails || !p.Runs[0].ResetFailed {
					t.Errorf("t2 (its reset fails): %+v, want %s", p, schema.QuarantineSetupFails)
				}
			case flaky[p.TaskID]:
				if p.Reason != "" {
					flagged++
					if p.Reason != schema.QuarantineGraderDisagrees {
						t.Errorf("%s: %s (%s), want %s", p.TaskID, p.Reason, p.Evidence, schema.QuarantineGraderDisagrees)
					}
				}
			case p.Reason != "":
				t.Errorf("%s (steady): unfit for %s: %s", p.TaskID, p.Reason, p.Evidence)
			}
			if p.TaskID != "t2" && (p.Runs[0].Screen == "" || p.Runs[0].Screen != p.Runs[1].Screen || p.Runs[0].Reward == nil || p.Runs[0].Again == nil) {
				t.Errorf("%s: runs %+v, want two equal first screens, graded twice", p.TaskID, p.Runs)
			}
		}
		// Binomial(8, 0.5): none or all in 1 of 128 seeds.
		if flagged == 0 || flagged == 8 {
			t.Errorf("%d of 8 flaky graders disagreed on their start state, want about half", flagged)
		}
		q, err := schema.ReadQuarantine(qfile)
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Tasks) != flagged+1 {
			t.Errorf("the quarantine holds %v, want the %d unfit tasks", q.IDs(), flagged+1)
		}
	})
}
