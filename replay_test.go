package rl

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// TestReplayFake collects a batch on fake desktops and replays it: on the
// same desktops every screen is identical and every reward the same; on
// desktops that grade otherwise (another seed) the screens still agree
// and the rewards that changed say so; on desktops whose screen differs
// every attempt diverges at its first step, and their tasks are
// quarantined.
func TestReplayFake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(3)
		desk := fake.Config{Seed: 5, DefaultReward: fake.Reward{P: 0.5}}
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(2)}, desk)
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		replay := func(cfg fake.Config, rollouts ...string) (*ReplayReport, error) {
			if cfg.Width == 0 {
				cfg.Width, cfg.Height = testWidth, testHeight
			}
			fleet := fake.NewFleet(cfg)
			rep, err := Replay(t.Context(), e.opts.Out, ReplayOptions{NewDesktop: fleet.New, Desktops: 2, Tasks: tasks,
				Rollouts: rollouts, Ready: e.opts.Ready})
			checkClosed(t, fleet)
			return rep, err
		}

		rep, err := replay(desk)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Replayed != 6 || rep.RewardsAgree != 6 || rep.Screens != 18 || rep.ScreensIdentical != 18 {
			t.Errorf("same desktops: %d replayed, %d rewards agree, %d of %d screens identical; want 6, 6, 18 of 18",
				rep.Replayed, rep.RewardsAgree, rep.ScreensIdentical, rep.Screens)
		}
		if rep.ReplayS <= 0 || rep.RecordedS <= 0 {
			t.Errorf("replay took %v s, the attempts %v s: want both measured", rep.ReplayS, rep.RecordedS)
		}
		for _, a := range rep.Attempts {
			if a.FirstDivergence != -1 || a.Error != "" || a.ReplayedReward == nil {
				t.Errorf("%s: diverged at %d, error %q, reward %v", a.RolloutID, a.FirstDivergence, a.Error, a.ReplayedReward)
			}
		}

		other := desk
		other.Seed = 6
		rep, err = replay(other)
		if err != nil {
			t.Fatal(err)
		}
		changed := 0
		for _, a := range rep.Attempts {
			if !a.RewardAgrees {
				changed++
				if *a.ReplayedReward == *a.RecordedReward {
					t.Errorf("%s: rewards %v and %v said to differ", a.RolloutID, *a.RecordedReward, *a.ReplayedReward)
				}
			}
		}
		if changed == 0 || rep.ScreensIdentical != rep.Screens || len(rep.Quarantined) != 0 {
			t.Errorf("another seed: %d rewards changed, %d of %d screens identical, quarantined %v; want some changed, every screen identical, none quarantined",
				changed, rep.ScreensIdentical, rep.Screens, rep.Quarantined)
		}

		bigger := desk
		bigger.Width, bigger.Height = 2*testWidth, 2*testHeight
		recs := readRecords(t, e.opts.Out)
		rep, err = replay(bigger, recs[0].RolloutID)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Attempts) != 1 || rep.Attempts[0].FirstDivergence != 0 || rep.Attempts[0].Screens[0].Distance != 1 {
			t.Fatalf("a bigger screen: %+v, want one attempt diverging at step 0, distance 1", rep.Attempts)
		}
		if !slices.Equal(rep.Quarantined, []string{recs[0].TaskID}) {
			t.Errorf("quarantined %v, want %s", rep.Quarantined, recs[0].TaskID)
		}
		q, err := schema.ReadQuarantine(filepath.Join(e.opts.Out, schema.TaskQuarantineFile))
		if err != nil || q.Tasks[recs[0].TaskID].Reason != schema.QuarantineReplayDiverges {
			t.Errorf("quarantine.json: %+v, %v; want %s for %s", q, err, schema.QuarantineReplayDiverges, recs[0].TaskID)
		}
	})
}

// TestReplayBadInput: a rollout not in the run, a task whose config
// changed, a harness other than the batch's: each refused before anything
// runs, naming what to do.
func TestReplayBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(1)
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
		changed := slices.Clone(tasks)
		changed[0].Instruction = "another thing"
		for _, tt := range []struct {
			name string
			opts ReplayOptions
			want []string
		}{
			{"unknown rollout", ReplayOptions{Tasks: tasks, Rollouts: []string{"nope"}}, []string{`no rollout "nope"`, "rollouts.jsonl"}},
			{"changed task", ReplayOptions{Tasks: changed}, []string{`task "t0" changed`, "replay with the tasks file the batch ran"}},
			{"missing task", ReplayOptions{}, []string{`task "t0", which the tasks given do not have`}},
			{"other harness", ReplayOptions{Tasks: tasks, Harness: qwen.New(qwen.Config{ImageMax: 3})}, []string{"replay with the batch's --harness and --image-max"}},
		} {
			tt.opts.NewDesktop = fleet.New
			_, err := Replay(t.Context(), e.opts.Out, tt.opts)
			if !errors.Is(err, ErrReplay) || !containsAll(err.Error(), tt.want...) {
				t.Errorf("%s: %v, want ErrReplay saying %q", tt.name, err, strings.Join(tt.want, "; "))
			}
		}
		if _, err := Replay(t.Context(), t.TempDir(), ReplayOptions{NewDesktop: fleet.New, Tasks: tasks}); !errors.Is(err, ErrReplay) {
			t.Errorf("a directory without a batch: %v, want ErrReplay", err)
		}
		checkClosed(t, fleet)
	})
}

// goldenDesktop is a fake desktop that says its attempts start from the
// golden state key.
type goldenDesktop struct {
	desktop.Desktop
	key string
}

func (g goldenDesktop) AttemptReport() desktop.AttemptReport {
	return desktop.AttemptReport{Reset: "golden", Golden: g.key}
}

func withGolden(f desktop.Factory, key string) desktop.Factory {
	return func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := f(ctx, slot)
		if err != nil {
			return nil, err
		}
		return goldenDesktop{d, key}, nil
	}
}

// A replay on desktops whose golden state has another key than the one an
// attempt started from does not run the attempt: it says the start cannot
// be rebuilt. With the same key it replays.
func TestReplayGoldenKeyChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(1)
		e := newBatchEnv(t, tasks, policytest.Options{Script: clicksThenDone(1)}, fake.Config{})
		e.opts.NewDesktop = withGolden(e.fleet.New, "key-one-0123456789")
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"key-one-0123456789", "key-two-0123456789"} {
			fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
			rep, err := Replay(t.Context(), e.opts.Out, ReplayOptions{NewDesktop: withGolden(fleet.New, key), Tasks: tasks, Ready: e.opts.Ready})
			checkClosed(t, fleet)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range rep.Attempts {
				same := key == "key-one-0123456789"
				switch {
				case same && (a.Error != "" || a.Golden != key || !a.RewardAgrees):
					t.Errorf("same key: %+v, want replayed from it", a)
				case !same && (!strings.Contains(a.Error, "its key changed") || a.ReplayedReward != nil || len(a.Screens) != 0):
					t.Errorf("another key: %+v, want the attempt refused, saying the key changed", a)
				}
			}
		}
	})
}
