package rl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// openedBatch is what openBatch built of a run directory, for comparing
// two ways of opening it.
type openedBatch struct {
	Opts    CollectOptions
	Harness string
	Found   resumeFound
	// Kept are the end states the bound counts, and their bytes.
	Kept      []desktop.EndState
	KeptBytes int64
	Held      map[string]schema.QuarantinedTask
	Skipped   []string
	Counts    map[Status]int
	// Graded, Reran and ErrorReruns are the scheduler's resume counts;
	// Phases each group's attempts' phases, Queued the queue's length.
	Graded, Reran, ErrorReruns, Queued int
	Phases                             map[string][]attemptPhase
}

func describeOpened(b *batch, found resumeFound) openedBatch {
	o := openedBatch{Opts: b.opts, Harness: harnessDescription(b.harness), Found: found,
		Kept: b.kept.refs, KeptBytes: b.kept.bytes, Held: b.quar.held.Tasks, Skipped: b.skipped,
		Counts: b.sched.counts, Graded: b.sched.resumedGraded, Reran: b.sched.reran,
		ErrorReruns: b.sched.errorReruns, Queued: len(b.sched.queue), Phases: map[string][]attemptPhase{}}
	// What is not data: the functions, and where the copy is.
	o.Opts.Out, o.Opts.NewDesktop, o.Opts.OnGroup, o.Opts.Logger, o.Opts.Harness = "", nil, nil, nil, nil
	for _, g := range b.sched.groups {
		for _, a := range g.attempts {
			o.Phases[g.id] = append(o.Phases[g.id], a.phase)
		}
	}
	return o
}

// TestOpenBatchBothDoors opens one resumed run directory as Collect opens
// it and as Serve does (the same groups restored as its journal would
// restore them) and finds the same in both: the options after their
// defaults, what the earlier run left (kept end states, a quarantined
// task, a torn last line, the records read) and where every attempt is.
func TestOpenBatchBothDoors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(3)
		flaky := tasks[1].ID
		desk := fake.Config{Seed: 3, DefaultReward: fake.Reward{P: 0.5},
			Rewards: map[string]fake.Reward{flaky: {P: 0.5, Flaky: true}}}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, desk)
		desk.EndStates = filepath.Join(e.opts.Out, schema.EndStatesDir)
		e.fleet = fake.NewFleet(withScreen(desk))
		e.opts.NewDesktop, e.opts.KeepEndStates, e.opts.Group, e.opts.GradeTwice = e.fleet.New, true, 8, 1
		e.opts.EndStateBytes = 1 << 20
		if _, err := e.collect(t.Context()); err != nil && !errors.Is(err, ErrBatchIncomplete) {
			t.Fatal(err)
		}
		torn := []byte(`{"rollout_id":"torn`)
		f, err := os.OpenFile(filepath.Join(e.opts.Out, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(torn); err != nil {
			t.Fatal(err)
		}
		f.Close()

		open := func(door batchDoor) openedBatch {
			t.Helper()
			opts := e.opts
			opts.Out = filepath.Join(t.TempDir(), "run")
			if err := os.CopyFS(opts.Out, os.DirFS(e.opts.Out)); err != nil {
				t.Fatal(err)
			}
			if door.open {
				// A service's settings are in its journal.
				os.Remove(filepath.Join(opts.Out, schema.BatchFile))
			}
			b, found, err := openBatch(e.pol, opts, door)
			if err != nil {
				t.Fatal(err)
			}
			defer b.store.Close()
			defer b.client.Close()
			return describeOpened(b, found)
		}
		collected := open(batchDoor{tasks: tasks})
		served := open(batchDoor{open: true, restore: func(b *batch, _ schema.Batch) error {
			n := AttemptsPerTask(b.opts.Group, b.opts.Oversample)
			for _, t := range tasks {
				b.sched.addLocked0(newGroup(groupID(b.pol.Version, t.ID), t, b.opts.Group, n))
			}
			return nil
		}})
		if diff := cmp.Diff(collected, served, cmp.AllowUnexported(openedBatch{})); diff != "" {
			t.Errorf("opened as collect and as a service (-collect +service):\n%s", diff)
		}
		// Both found what the earlier run left.
		if collected.Found.DroppedTail != int64(len(torn)) || len(collected.Kept) == 0 || collected.Held[flaky].Reason == "" || collected.Found.Read.Records == 0 {
			t.Errorf("opened %+v; want the torn tail cut, kept end states counted, %s quarantined, records read", collected, flaky)
		}
	})
}

// TestServiceEndStateBound restarts a service three times, each run
// keeping one end state, with room for two: a restarted service counts
// the states earlier runs kept, as a resumed collect does, and drops the
// oldest.
func TestServiceEndStateBound(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	states := filepath.Join(e.opts.Out, schema.EndStatesDir)
	e.fleet = fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, DefaultReward: fake.Reward{P: 1}, Seed: 3, EndStates: states})
	e.opts.NewDesktop, e.opts.KeepEndStates, e.opts.Desktops, e.opts.Group = e.fleet.New, true, 1, 1
	// One state is about 70 bytes: room for two.
	e.opts.EndStateBytes = 150
	for i := range 3 {
		s := e.serve(t)
		info, _, err := s.Submit(GroupRequest{Task: inlineTask(i)})
		if err != nil {
			t.Fatal(err)
		}
		if info := waitEnded(t, s, info.ID); info.State != GroupClosed {
			t.Fatalf("run %d: group %s %s, want closed", i+1, info.ID, info.State)
		}
		if _, err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	checkClosed(t, e.fleet)
	var kept int64
	for _, r := range readRecords(t, e.opts.Out) {
		if r.EndState == nil || r.EndState.Ref == "" {
			t.Fatalf("%s: end state %+v, want one kept", r.RolloutID, r.EndState)
		}
		kept += r.EndState.Bytes
	}
	if kept <= e.opts.EndStateBytes {
		t.Fatalf("the three runs kept %d bytes, within the bound %d: the test needs more", kept, e.opts.EndStateBytes)
	}
	files, err := os.ReadDir(states)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var size int64
	for _, f := range files {
		info, err := f.Info()
		if err != nil {
			t.Fatal(err)
		}
		names, size = append(names, f.Name()), size+info.Size()
	}
	if len(files) > 2 || size > e.opts.EndStateBytes {
		t.Errorf("%d end states of %d bytes left (%s), want at most 2 within %d", len(files), size, strings.Join(names, " "), e.opts.EndStateBytes)
	}
}
