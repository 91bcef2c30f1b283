//go:build integration

package osworld

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestIntegrationEndStates keeps the end states of attempts on the test
// guest, one in the VM and one in a clone of the task's golden state, and
// grades them again without the agent after the task's wrong expected
// value is fixed: the solved attempts, recorded 0, get 1, which a fresh
// desktop (nothing done) would not. Dropped states go with their files.
func TestIntegrationEndStates(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("keeping end states needs root")
	}
	cfg := itConfig(t, "legato-itosw-endst-")
	cfg.Golden = GoldenConfig{Max: 2, Fork: true}
	cfg.VM.ForkDir = "/dev/shm/legato-itosw-endst"
	removeForkDir(t, cfg.VM.ForkDir)
	out := t.TempDir()
	cfg.EndStates = filepath.Join(out, schema.EndStatesDir)
	ctx := t.Context()
	p, all := itPool(t, cfg, filepath.Join("testdata", "tasks", "guest_tasks.json"))
	var task desktop.Task
	for _, tk := range all {
		if tk.ID == "legato-term-echo" {
			task = tk
		}
	}
	// The task as first published, with a wrong expected value: the
	// solved attempts score 0.
	broken := task
	broken.Evaluator = bytes.ReplaceAll(task.Evaluator, []byte(`"hello legato"`), []byte(`"goodbye legato"`))
	if bytes.Equal(broken.Evaluator, task.Evaluator) {
		t.Fatal("the task's expected value did not change")
	}
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
	defer srv.Close()

	start := time.Now()
	// One desktop, two attempts: the first takes the golden state and
	// its template and runs in the VM, the second in a clone.
	if _, err := rl.Collect(ctx, []desktop.Task{broken}, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-endstates"}, rl.CollectOptions{
		Out: out, NewDesktop: p.New, Desktops: 1, Group: 2, MaxSteps: 4, EnvRetries: -1, KeepEndStates: true, Logger: cfg.Logger,
	}); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	collectS := time.Since(start).Seconds()
	var refs []string
	forked := 0
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		if r.EndState == nil || r.EndState.Ref == "" || r.Reward == nil || *r.Reward != 0 {
			t.Errorf("%s: end state %+v, reward %s: want a kept state and reward 0 (the wrong expected value)", r.RolloutID, r.EndState, fmtReward(r.Reward))
			return nil
		}
		if r.Env != nil && r.Env.Reset == string(ResetGoldenFork) {
			forked++
		}
		refs = append(refs, r.EndState.Ref)
		t.Logf("%s: kept %s, %d MiB on disk", r.RolloutID, r.EndState.Ref, r.EndState.Bytes>>20)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(refs) != 2 {
		t.Fatalf("%d attempts kept end states, want 2", len(refs))
	}
	if forked == 0 {
		t.Error("no attempt ran in a clone of the golden state: a clone's keep was not tested")
	}

	// With the fixed task, each state grades 1: here on a desktop of the
	// test's (a fresh VM), which brings the state back in a clone.
	// Slot 1: a pool closes a slot's desktop when it makes another, and
	// the collect's (slot 0) is not this test's.
	d, err := p.New(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g := d.(desktop.EndStateGrader)
	for _, ref := range refs {
		t0 := time.Now()
		r, err := g.GradeEndState(ctx, ref, task, desktop.Action{})
		if err != nil || r != 1 {
			t.Errorf("end state %s graded with the fixed task: %v, %v; want 1", ref, r, err)
		}
		t.Logf("end state %s brought back and graded in %.1f s", ref, time.Since(t0).Seconds())
	}
	// The desktop serves attempts again after, on its own VM: a fresh
	// attempt that did nothing scores 0 with the same task.
	if err := d.Reset(ctx, task); err != nil {
		t.Fatalf("Reset after grading kept end states: %v", err)
	}
	if r, err := d.Evaluate(ctx, task); err != nil || r != 0 {
		t.Errorf("a fresh attempt graded %v, %v; want 0 (nothing done)", r, err)
	}

	// regrade writes the new rewards beside the recorded ones.
	t0 := time.Now()
	// On the test's desktop (a second boot would check nothing more); the
	// batch's Close leaves it open for the checks below.
	lent := func(context.Context, int) (desktop.Desktop, error) { return lentDesktop{d.(*VMDesktop)}, nil }
	rep, err := rl.Regrade(ctx, out, rl.RegradeOptions{NewDesktop: lent, Tasks: []desktop.Task{task}, Logger: cfg.Logger})
	if err != nil {
		t.Fatalf("Regrade: %v", err)
	}
	t.Logf("regraded %d end states in %.1f s (collect took %.1f s for them)", len(rep.Regrades), time.Since(t0).Seconds(), collectS)
	if rep.Changed != 2 {
		t.Errorf("%d rewards changed after the expected value was fixed, want 2", rep.Changed)
	}
	for _, r := range rep.Regrades {
		if r.Regraded == nil || *r.Regraded != 1 || r.Reward == nil || *r.Reward != 0 {
			t.Errorf("%s regraded with the fixed task: %s (recorded %s), error %q; want 1 beside 0", r.RolloutID, fmtReward(r.Regraded), fmtReward(r.Reward), r.Error)
		}
	}

	// Dropping a state removes its directory; grading it then says it is
	// gone.
	k := d.(desktop.EndStateKeeper)
	if err := k.DropEndState(ctx, refs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.EndStates, refs[0])); err == nil {
		t.Errorf("end state %s still on disk after DropEndState", refs[0])
	}
	if _, err := g.GradeEndState(ctx, refs[0], task, desktop.Action{}); !errors.Is(err, desktop.ErrNoEndState) {
		t.Errorf("grading a dropped end state: %v, want ErrNoEndState", err)
	}
	if err := k.DropEndState(ctx, "../../etc"); err == nil {
		t.Error("DropEndState took a name that is not an end state's")
	}
}

// lentDesktop is a test's desktop lent to a batch: the batch's Close
// leaves it open.
type lentDesktop struct{ *VMDesktop }

func (lentDesktop) Close() error { return nil }
