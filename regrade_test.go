package rl

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestRegradeKeptEndStates keeps every attempt's end state, then grades
// them again without running the agent: with the same tasks every reward
// comes out the same; after one task's evaluator changed (to infeasible,
// which the attempts that ended in DONE fail), its attempts get the new
// reward, the others keep theirs, and rollouts.jsonl is unchanged.
func TestRegradeKeptEndStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(2)
		desk := fake.Config{Seed: 4, DefaultReward: fake.Reward{P: 1}}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		desk.EndStates = filepath.Join(e.opts.Out, schema.EndStatesDir)
		e.fleet = fake.NewFleet(withScreen(desk))
		e.opts.NewDesktop, e.opts.KeepEndStates = e.fleet.New, true
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		before, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range readRecords(t, e.opts.Out) {
			if r.EndState == nil || r.EndState.Ref == "" || r.EndState.Bytes == 0 {
				t.Fatalf("%s: end state %+v, want one kept", r.RolloutID, r.EndState)
			}
		}
		regrade := func(tasks []Task) *RegradeReport {
			t.Helper()
			fleet := fake.NewFleet(withScreen(desk))
			rep, err := Regrade(t.Context(), e.opts.Out, RegradeOptions{NewDesktop: fleet.New, Desktops: 2, Tasks: tasks})
			checkClosed(t, fleet)
			if err != nil {
				t.Fatal(err)
			}
			return rep
		}
		rep := regrade(tasks)
		if len(rep.Regrades) != 4 || rep.Changed != 0 || rep.Failed != 0 {
			t.Errorf("same tasks: %d regraded, %d changed, %d failed; want 4, 0, 0", len(rep.Regrades), rep.Changed, rep.Failed)
		}
		for _, r := range rep.Regrades {
			if r.At.IsZero() {
				t.Errorf("%s: regraded at no time", r.RolloutID)
			}
		}

		changed := slices.Clone(tasks)
		changed[1].Evaluator = json.RawMessage(`{"func":"infeasible"}`)
		changed[1].Raw = nil
		rep = regrade(changed)
		for _, r := range rep.Regrades {
			want := 1.0
			if r.TaskID == "t1" {
				want = 0
				if r.TaskSHA == r.RecordedTaskSHA {
					t.Errorf("%s: graded with task sha %s, the one it ran", r.RolloutID, r.TaskSHA)
				}
			}
			if r.Regraded == nil || *r.Regraded != want || *r.Reward != 1 {
				t.Errorf("%s (%s): reward %v regraded %v (%s), want 1 then %v", r.RolloutID, r.TaskID, r.Reward, r.Regraded, r.Error, want)
			}
		}
		if rep.Changed != 2 {
			t.Errorf("%d changed, want t1's 2", rep.Changed)
		}
		latest, err := schema.LatestRegrades(e.opts.Out)
		if err != nil || len(latest) != 4 {
			t.Fatalf("regrades.jsonl: %d latest, %v", len(latest), err)
		}
		after, _ := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
		if string(after) != string(before) {
			t.Error("regrading changed rollouts.jsonl")
		}

		// A state gone is said so, not graded.
		rec := readRecords(t, e.opts.Out)[0]
		if err := os.Remove(filepath.Join(desk.EndStates, rec.EndState.Ref+".json")); err != nil {
			t.Fatal(err)
		}
		fleet := fake.NewFleet(withScreen(desk))
		rep, err = Regrade(t.Context(), e.opts.Out, RegradeOptions{NewDesktop: fleet.New, Tasks: tasks, Rollouts: []string{rec.RolloutID}})
		checkClosed(t, fleet)
		if err != nil || rep.Failed != 1 || rep.Regrades[0].Error == "" {
			t.Errorf("a removed state: %+v, %v; want it failed, saying it is gone", rep, err)
		}
		if _, err := Regrade(t.Context(), e.opts.Out, RegradeOptions{NewDesktop: fleet.New, Tasks: tasks, Rollouts: []string{"nope"}}); !errors.Is(err, ErrRegrade) {
			t.Errorf("an unknown rollout: %v, want ErrRegrade", err)
		}
	})
}

// TestEndStateBound drops the oldest kept states past the batch's bound.
func TestEndStateBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(3)
		desk := fake.Config{DefaultReward: fake.Reward{P: 1}}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		desk.EndStates = filepath.Join(e.opts.Out, schema.EndStatesDir)
		e.fleet = fake.NewFleet(withScreen(desk))
		e.opts.NewDesktop, e.opts.KeepEndStates, e.opts.Desktops = e.fleet.New, true, 1
		// One state is about 70 bytes: room for two.
		e.opts.EndStateBytes = 150
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		files, err := os.ReadDir(desk.EndStates)
		if err != nil {
			t.Fatal(err)
		}
		var size int64
		for _, f := range files {
			info, _ := f.Info()
			size += info.Size()
		}
		if len(files) == 0 || size > e.opts.EndStateBytes {
			t.Errorf("%d kept states of %d bytes, want some within %d", len(files), size, e.opts.EndStateBytes)
		}
		recs := readRecords(t, e.opts.Out)
		last := recs[len(recs)-1].EndState.Ref
		if _, err := os.Stat(filepath.Join(desk.EndStates, last+".json")); err != nil {
			t.Errorf("the newest state was dropped: %v", err)
		}
	})
}

// TestRegradeRefusesSymlinkedEndState: a symlink planted in end-states/
// in a kept state's stead, to a file only root may read, is refused, not
// followed: regrade said the file's first byte in its error.
func TestRegradeRefusesSymlinkedEndState(t *testing.T) {
	out, desk, tasks := keptRun(t)
	rec := readRecords(t, out)[0]
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("Secret of root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(desk.EndStates, rec.EndState.Ref+".json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, path); err != nil {
		t.Fatal(err)
	}
	fleet := fake.NewFleet(withScreen(desk))
	rep, err := Regrade(t.Context(), out, RegradeOptions{NewDesktop: fleet.New, Tasks: tasks, Rollouts: []string{rec.RolloutID}})
	checkClosed(t, fleet)
	if err != nil || len(rep.Regrades) != 1 {
		t.Fatalf("Regrade: %+v, %v; want one regrade, failed", rep, err)
	}
	msg := rep.Regrades[0].Error
	if rep.Failed != 1 || !strings.Contains(msg, path+" is a symlink") || strings.Contains(msg, "'S'") {
		t.Errorf("a symlinked end state: %d failed, error %q; want it refused as a symlink, naming it, its target unread", rep.Failed, msg)
	}
}

// TestRegradeFIFOEndState: a FIFO planted in a kept state's stead is
// refused at once: regrade blocked opening it until a writer came (a
// signal did not end it).
func TestRegradeFIFOEndState(t *testing.T) {
	out, desk, tasks := keptRun(t)
	rec := readRecords(t, out)[0]
	path := filepath.Join(desk.EndStates, rec.EndState.Ref+".json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep *RegradeReport
		err error
	}
	fleet := fake.NewFleet(withScreen(desk))
	done := make(chan result, 1)
	go func() {
		rep, err := Regrade(t.Context(), out, RegradeOptions{NewDesktop: fleet.New, Tasks: tasks, Rollouts: []string{rec.RolloutID}})
		done <- result{rep, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		// Open the FIFO's other end: the blocked regrade goes on, and
		// ends before the test.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatal("regrade still blocked on the FIFO after 2 minutes")
	}
	checkClosed(t, fleet)
	if r.err != nil || r.rep.Failed != 1 || !strings.Contains(r.rep.Regrades[0].Error, path+" is a FIFO") {
		t.Errorf("a FIFO for an end state: %+v, %v; want it failed, saying it is a FIFO", r.rep, r.err)
	}
}

// keptRun collects a run of one task's two attempts that kept their end
// states, in a directory that outlives the bubble (a regrade that blocks in
// a system call would never let a bubble end), and says where, with the
// desktops' config and the tasks.
func keptRun(t *testing.T) (out string, desk fake.Config, tasks []Task) {
	out = filepath.Join(t.TempDir(), "run")
	tasks = testTasks(1)
	desk = fake.Config{Seed: 4, DefaultReward: fake.Reward{P: 1}, EndStates: filepath.Join(out, schema.EndStatesDir)}
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		e.opts.Out = out
		e.fleet = fake.NewFleet(withScreen(desk))
		e.opts.NewDesktop, e.opts.KeepEndStates = e.fleet.New, true
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	return out, desk, tasks
}

// withScreen gives a fake config the tests' screen size.
func withScreen(c fake.Config) fake.Config {
	c.Width, c.Height = testWidth, testHeight
	return c
}

// TestReplayRegradeReadAsExport: replay and regrade read a run by export's
// rule (schema.ReadRunAttempts). A second final record of an attempt (as
// two collects writing one file, or an edit, leave it) and a damaged line
// in the middle of rollouts.jsonl refuse the run with export's errors,
// advising the repair, before any desktop starts: the attempt is neither
// replayed and regraded twice, nor lost without a word.
func TestReplayRegradeReadAsExport(t *testing.T) {
	out, desk, tasks := keptRun(t)
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(out, schema.RecordsFile)
		clean, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(string(clean), "\n")
		if len(lines) != 3 || lines[2] != "" { // two records and the end
			t.Fatalf("rollouts.jsonl has %d lines, want 2 records", len(lines)-1)
		}
		first := readRecords(t, out)[0]
		dup := strings.Replace(lines[0], `"rollout_id":"`+first.RolloutID+`"`, `"rollout_id":"`+first.RolloutID+`-again"`, 1)
		for _, tc := range []struct {
			name    string
			records string
			check   func(err error) bool
		}{
			{"duplicate final record", string(clean) + dup, func(err error) bool {
				var d *schema.DuplicateFinalError
				return errors.As(err, &d) && d.FirstLine == 1 && d.Line == 3 && d.GroupID == first.GroupID
			}},
			{"damaged line", lines[0][:len(lines[0])/2] + "\n" + lines[1], func(err error) bool {
				var line *schema.LineError
				return errors.Is(err, export.ErrDamagedRecords) && errors.As(err, &line) && line.Line == 1
			}},
		} {
			if err := os.WriteFile(path, []byte(tc.records), 0o644); err != nil {
				t.Fatal(err)
			}
			fleet := fake.NewFleet(withScreen(desk))
			_, err := Replay(t.Context(), out, ReplayOptions{NewDesktop: fleet.New, Tasks: tasks})
			if !tc.check(err) || !strings.Contains(err.Error(), "legato rl repair "+out) {
				t.Errorf("%s: Replay = %v, want export's error advising legato rl repair", tc.name, err)
			}
			_, err = Regrade(t.Context(), out, RegradeOptions{NewDesktop: fleet.New, Tasks: tasks})
			if !tc.check(err) || !strings.Contains(err.Error(), "legato rl repair "+out) {
				t.Errorf("%s: Regrade = %v, want export's error advising legato rl repair", tc.name, err)
			}
			if n := len(fleet.Desktops()); n != 0 {
				t.Errorf("%s: %d desktops started for a refused run", tc.name, n)
			}
			_, err = export.ExportSteps(out, filepath.Join(t.TempDir(), "out.jsonl"), export.Options{})
			if !tc.check(err) {
				t.Errorf("%s: ExportSteps = %v, which replay's error should be", tc.name, err)
			}
		}
		if _, err := os.Stat(filepath.Join(out, schema.RegradeFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused regrades wrote %s (%v)", schema.RegradeFile, err)
		}
	})
}
