package rl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestGradeTwiceQuarantines grades every end state twice: the task whose
// grader disagrees with itself is counted, put into the run's and the
// shared quarantine with its evidence, and the next batch sharing the file
// skips it, naming it; the steady tasks' second grades agree. The same task
// with a fixed config is not held.
func TestGradeTwiceQuarantines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(3)
		flaky := tasks[1].ID
		desk := fake.Config{Seed: 3, DefaultReward: fake.Reward{P: 0.5},
			Rewards: map[string]fake.Reward{flaky: {P: 0.5, Flaky: true}}}
		shared := filepath.Join(t.TempDir(), "shared", "quarantine.json")

		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		e.opts.Group, e.opts.GradeTwice, e.opts.Quarantine = 8, 1, shared
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		recs := readRecords(t, e.opts.Out)
		disagree := map[string]int{}
		for _, r := range recs {
			g := r.SecondGrade
			if g == nil || g.Reward == nil {
				t.Fatalf("%s: second grade %+v, want a reward (every attempt is graded twice)", r.RolloutID, g)
			}
			if g.Agrees != (*g.Reward == *r.Reward) {
				t.Errorf("%s: rewards %v and %v, agrees %v", r.RolloutID, *r.Reward, *g.Reward, g.Agrees)
			}
			if !g.Agrees {
				disagree[r.TaskID]++
			}
			if want := TaskSHA(taskByID(tasks, r.TaskID)); r.TaskSHA != want {
				t.Errorf("%s: task_sha256 %q, want %q", r.RolloutID, r.TaskSHA, want)
			}
		}
		if disagree[flaky] == 0 || len(disagree) != 1 {
			t.Fatalf("disagreements by task %v: want some on %s only", disagree, flaky)
		}
		if diff := cmp.Diff(disagree, sum.GraderDisagreements); diff != "" {
			t.Errorf("summary's grader disagreements (-records +summary):\n%s", diff)
		}
		if sum.GradedTwice != len(recs) {
			t.Errorf("summary: %d graded twice, want %d", sum.GradedTwice, len(recs))
		}
		if diff := cmp.Diff(map[string]string{flaky: schema.QuarantineGraderDisagrees}, sum.Quarantined); diff != "" {
			t.Errorf("summary's quarantined (-want +got):\n%s", diff)
		}
		for _, path := range []string{filepath.Join(e.opts.Out, schema.TaskQuarantineFile), shared} {
			q, err := schema.ReadQuarantine(path)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := q.Holds(flaky, TaskSHA(tasks[1]))
			if !ok || len(q.Tasks) != 1 || got.Reason != schema.QuarantineGraderDisagrees || got.Evidence == "" || len(got.Rollouts) != 1 {
				t.Errorf("%s holds %+v, want %s for %s with evidence and its rollout", path, q.Tasks, schema.QuarantineGraderDisagrees, flaky)
			}
		}

		// The next batch, sharing the file, skips the flaky task.
		next := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		next.opts.Quarantine = shared
		sum2, err := next.collect(t.Context())
		if err != nil {
			t.Fatalf("a batch that skips a quarantined task: %v, want it complete", err)
		}
		for _, r := range readRecords(t, next.opts.Out) {
			if r.TaskID == flaky {
				t.Errorf("the quarantined task ran: %s", r.RolloutID)
			}
		}
		if !slices.Equal(sum2.QuarantineSkipped, []string{flaky}) || sum2.State != StateComplete || len(sum2.Warnings) == 0 {
			t.Errorf("next batch: skipped %v, state %s, warnings %q; want %s skipped, complete, with a warning", sum2.QuarantineSkipped, sum2.State, sum2.Warnings, flaky)
		}
		groups := next.seenGroups()
		for _, g := range groups {
			if g.TaskID == flaky && g.Closed {
				t.Errorf("the quarantined task's group closed")
			}
		}
		if len(groups) != 3 {
			t.Errorf("OnGroup saw %d groups, want 3 (the skipped one ends short)", len(groups))
		}

		// A fixed task (another config) is not held.
		fixed := slices.Clone(tasks)
		fixed[1].Instruction += " (fixed)"
		third := newBatchEnv(t, fixed, policytest.Options{Script: clicksThenDone(1)}, fake.Config{DefaultReward: fake.Reward{P: 1}})
		third.opts.Quarantine = shared
		sum3, err := third.collect(t.Context())
		if err != nil || len(sum3.QuarantineSkipped) != 0 {
			t.Errorf("a fixed task: skipped %v, err %v; want it run", sum3.QuarantineSkipped, err)
		}
	})
}

// TestSetupUnfit: the setup quarantine wants K failed desktops and
// failures outnumbering passes.
func TestSetupUnfit(t *testing.T) {
	for _, c := range []struct {
		failed, passed, k int
		want              bool
	}{
		{3, 0, 3, true},   // a broken task: every reset fails
		{2, 0, 3, false},  // not yet k desktops
		{3, 2, 3, true},   // most of its resets fail
		{3, 3, 3, false},  // half: the fleet may be to blame
		{3, 40, 3, false}, // a flaky fleet in a long batch
		{10, 9, 3, true},  // more failures than passes, past k
		{1, 0, 1, true},   // k = 1: the first failure, with no pass
		{1, 1, 1, false},  // k = 1 after a pass
		{1000, 0, 1 << 20, false},
	} {
		if got := setupUnfit(c.failed, c.passed, c.k); got != c.want {
			t.Errorf("setupUnfit(failed %d, passed %d, k %d) = %v, want %v", c.failed, c.passed, c.k, got, c.want)
		}
	}
}

// TestQuarantineSetupFailsFlakyFleet: a task whose reset fails on three
// desktops but passed on more (the desktops fail, not the task) is not
// quarantined, and its group fills.
func TestQuarantineSetupFailsFlakyFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(1)
		// Each of three desktops fails its second reset; their first resets
		// passed, so the third failure comes after three passes at least.
		var faults []fake.Fault
		for i := range 3 {
			faults = append(faults, fake.Fault{Phase: fake.PhaseReset, Kind: fake.FaultError, OnCall: 2, Desktop: fmt.Sprintf("fake-%d", i)})
		}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, fake.Config{DefaultReward: fake.Reward{P: 1}, Faults: faults})
		e.opts.Desktops, e.opts.Group, e.opts.QuarantineSetupFails, e.opts.EnvRetries = 4, 8, 3, 3
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("Collect: %v, want every attempt graded", err)
		}
		if len(sum.Quarantined) != 0 {
			t.Errorf("quarantined %v, want none: the task's resets passed more often than they failed", sum.Quarantined)
		}
		if got := sum.Counts[schema.StatusOK]; got != 8 {
			t.Errorf("%d attempts graded, want the group's 8 (counts %v)", got, sum.Counts)
		}
		if got := sum.Counts[schema.StatusRetried]; got != 3 {
			t.Errorf("%d retried, want the 3 tries whose reset failed (counts %v)", got, sum.Counts)
		}
	})
}

// TestQuarantineSetupFails quarantines a task whose reset fails on
// QuarantineSetupFails desktops; the other task's attempts are untouched.
func TestQuarantineSetupFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(2)
		bad := tasks[0].ID
		desk := fake.Config{DefaultReward: fake.Reward{P: 1},
			Faults: []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, Prob: 1, Task: bad}}}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		e.opts.QuarantineSetupFails = 3
		sum, err := e.collect(t.Context())
		var inc *IncompleteError
		if !errors.As(err, &inc) || inc.Short != 1 {
			t.Fatalf("Collect: %v, want the bad task's group short", err)
		}
		if sum.Quarantined[bad] != schema.QuarantineSetupFails || len(sum.Quarantined) != 1 {
			t.Errorf("quarantined %v, want %s: %s", sum.Quarantined, bad, schema.QuarantineSetupFails)
		}
		q, err := schema.ReadQuarantine(filepath.Join(e.opts.Out, schema.TaskQuarantineFile))
		if err != nil {
			t.Fatal(err)
		}
		if got := q.Tasks[bad]; len(got.Rollouts) != 3 {
			t.Errorf("evidence names %d rollouts %v, want the 3 whose reset failed", len(got.Rollouts), got.Rollouts)
		}
		// Collecting into the directory again holds the task: its error
		// records are not rerun.
		e2 := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		e2.opts.Out = e.opts.Out
		sum2, err := e2.collect(t.Context())
		if err != nil || !slices.Equal(sum2.QuarantineSkipped, []string{bad}) {
			t.Errorf("resume: skipped %v, err %v; want %s skipped and the batch complete", sum2.QuarantineSkipped, err, bad)
		}
		// The resumed batch's summary still says the batch quarantined it.
		if diff := cmp.Diff(map[string]string{bad: schema.QuarantineSetupFails}, sum2.Quarantined); diff != "" {
			t.Errorf("resumed summary's quarantined (-want +got):\n%s", diff)
		}
	})
}

// A quarantine file that is not one is refused, naming it.
func TestQuarantineFileBad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "q.json")
		if err := os.WriteFile(path, []byte(`{"schema":"legato.quarantine/v0","tasks":{"t0":{"reason":"x"}}}`), 0o644); err != nil {
			t.Fatal(err)
		}
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1)}, fake.Config{})
		e.opts.Quarantine = path
		if _, err := e.collect(t.Context()); err == nil || !containsAll(err.Error(), path, "t0", "task_sha256") {
			t.Errorf("Collect with a bad quarantine file: %v, want an error naming the file, the task and the missing field", err)
		}
	})
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func taskByID(tasks []Task, id string) Task {
	for _, t := range tasks {
		if t.ID == id {
			return t
		}
	}
	return Task{}
}

// TestServiceQuarantine: a service grading twice quarantines the task
// whose grader disagrees with itself, and refuses new groups of it (the
// HTTP front answers 409), naming why; other tasks are still taken.
func TestServiceQuarantine(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.fleet = fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, Seed: 3,
		Rewards: map[string]fake.Reward{"t0": {P: 0.5, Flaky: true}}})
	e.opts.NewDesktop, e.opts.GradeTwice, e.opts.Group = e.fleet.New, 1, 8
	s := e.serve(t)
	defer s.Close(context.Background())
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s, info.ID)
	_, _, err = s.Submit(GroupRequest{Task: inlineTask(0)})
	if !errors.Is(err, ErrQuarantined) || !containsAll(err.Error(), "t0", schema.QuarantineGraderDisagrees, schema.TaskQuarantineFile) {
		t.Errorf("a group of the quarantined task: %v, want ErrQuarantined naming the task, why and the file", err)
	}
	if _, _, err := s.Submit(GroupRequest{Task: inlineTask(1)}); err != nil {
		t.Errorf("a group of another task: %v", err)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkClosed(t, e.fleet)
}

// TestServiceRestartEndsQuarantined: a group queued before a restart whose
// task was quarantined since (here in the shared file) ends short when the
// service comes back, named in its summary, and a group of another task
// runs on.
func TestServiceRestartEndsQuarantined(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.opts.Quarantine = filepath.Join(t.TempDir(), "shared-quarantine.json")
	s := e.serve(t)
	if _, err := s.SetPolicy("v1", true); err != nil { // nothing runs
		t.Fatal(err)
	}
	bad, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	good, _, err := s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	task, err := s.resolve(inlineTask(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.AddQuarantined(e.opts.Quarantine, map[string]schema.QuarantinedTask{
		"t0": {TaskSHA: TaskSHA(task), Reason: schema.QuarantineGraderDisagrees, Evidence: "another batch's grades"}}); err != nil {
		t.Fatal(err)
	}

	s2 := e.serve(t)
	defer s2.Close(context.Background())
	// The policy is paused: a group left queued never ends, so the wait
	// has a bound (any delay while it ends would be the machine's).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if info, err := s2.Wait(ctx, bad.ID); err != nil || info.State != GroupShort {
		t.Errorf("queued group of the task quarantined since: %+v %v, want it ended short", info, err)
	}
	if _, err := s2.SetPolicy("v1", false); err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s2, good.ID); info.State != GroupClosed {
		t.Errorf("group of another task: %+v, want closed", info)
	}
	sum, err := s2.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sum.QuarantineSkipped, []string{"t0"}) {
		t.Errorf("summary's quarantine_skipped %v, want [t0]", sum.QuarantineSkipped)
	}
	checkClosed(t, e.fleet)
}

// A desktop that crashes on the second grade keeps the first: the record is
// ok with its reward and says why the second grade is missing, and the
// desktop is replaced.
func TestSecondGradeDesktopFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1)},
			fake.Config{DefaultReward: fake.Reward{P: 1}, Faults: []fake.Fault{{Phase: fake.PhaseEvaluate, Kind: fake.FaultCrash, OnCall: 2, Desktop: "fake-0"}}})
		e.opts.GradeTwice, e.opts.Desktops = 1, 1
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		recs := readRecords(t, e.opts.Out)
		first := recs[0]
		if first.Status != schema.StatusOK || first.Reward == nil || *first.Reward != 1 || first.SecondGrade == nil || first.SecondGrade.Error == "" || first.SecondGrade.Reward != nil {
			t.Errorf("first record: %s, reward %v, second grade %+v; want ok with reward 1 and the second grade's error", first.Status, first.Reward, first.SecondGrade)
		}
		if n := len(e.fleet.Desktops()); n != 2 {
			t.Errorf("%d desktops created, want 2 (the crashed one replaced)", n)
		}
	})
}
