package fake_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

// outcome is everything random about one attempt on a fake desktop.
type outcome struct {
	Reward float64
	Took   map[fake.Phase]time.Duration
	// FailedObserves lists the observations (from 0) an injected fault
	// failed.
	FailedObserves []int
}

// runAttempt runs an attempt with three observe-act steps in ctx and
// returns its outcome. Time is the synctest bubble's.
func runAttempt(t *testing.T, ctx context.Context, d desktop.Desktop, task desktop.Task) outcome {
	t.Helper()
	o := outcome{Took: make(map[fake.Phase]time.Duration)}
	timed := func(p fake.Phase, f func() error) error {
		start := time.Now()
		err := f()
		if d := time.Since(start); d != 0 {
			o.Took[p] += d
		}
		return err
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(timed(fake.PhaseReset, func() error { return d.Reset(ctx, task) }))
	must(timed(fake.PhaseWaitAfterReset, func() error { return d.WaitAfterReset(ctx) }))
	for i := range 3 {
		if err := timed(fake.PhaseObserve, func() error { _, err := d.Observe(ctx); return err }); err != nil {
			o.FailedObserves = append(o.FailedObserves, i)
		}
		must(timed(fake.PhaseAct, func() error { _, err := d.Act(ctx, codeAction); return err }))
	}
	must(timed(fake.PhaseWaitBeforeEval, func() error { return d.WaitBeforeEval(ctx) }))
	must(timed(fake.PhaseEvaluate, func() error {
		var err error
		o.Reward, err = d.Evaluate(ctx, task)
		return err
	}))
	return o
}

// randomDesk draws everything: rewards, latencies of every kind and
// observations that fail.
func randomDesk(seed uint64) fake.Config {
	return fake.Config{
		Width: 64, Height: 64, Seed: seed,
		DefaultReward: fake.Reward{P: 0.5},
		Latency: fake.Latencies{
			Reset:    fake.Latency{Median: 2 * time.Second, Sigma: 0.5},
			Act:      fake.Latency{Scale: 100 * time.Millisecond, Alpha: 1.5},
			Settle:   fake.Latency{Max: time.Second},
			Evaluate: fake.Latency{Min: time.Second, Max: 2 * time.Second},
		},
		Faults: []fake.Fault{{Phase: fake.PhaseObserve, Kind: fake.FaultError, Prob: 0.3}},
	}
}

// batchAttempts lists the attempts of a small batch: two groups of four,
// and a second try of each.
func batchAttempts(task desktop.Task) []desktop.Attempt {
	var as []desktop.Attempt
	for _, g := range []string{"v1/" + task.ID, "v2/" + task.ID} {
		for i := range 4 {
			for try := range 2 {
				as = append(as, desktop.Attempt{GroupID: g, TaskID: task.ID, Index: i, Try: try})
			}
		}
	}
	return as
}

// runOn runs every attempt, in order, the i-th on desktops[i%len], each
// with its identity in the ctx, and returns the outcomes by attempt.
func runOn(t *testing.T, desktops []desktop.Desktop, task desktop.Task, attempts []desktop.Attempt) map[desktop.Attempt]outcome {
	t.Helper()
	out := make(map[desktop.Attempt]outcome)
	for i, a := range attempts {
		out[a] = runAttempt(t, desktop.WithAttempt(t.Context(), a), desktops[i%len(desktops)], task)
	}
	return out
}

func fleetDesktops(t *testing.T, cfg fake.Config, n int) []desktop.Desktop {
	t.Helper()
	fleet := fake.NewFleet(cfg)
	var ds []desktop.Desktop
	for slot := range n {
		d, err := fleet.New(t.Context(), slot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		ds = append(ds, d)
	}
	return ds
}

// TestAttemptDrawsFollowTheAttempt checks that with the attempt in the ctx,
// an attempt's reward, latencies and faults depend on the seed and the
// attempt only: the same on one desktop as on eight with seeds of their
// own, in any order, after the desktop ran other attempts.
func TestAttemptDrawsFollowTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		task := feasibleTask(t)
		attempts := batchAttempts(task)
		one := runOn(t, fleetDesktops(t, randomDesk(11), 1), task, attempts)

		reversed := make([]desktop.Attempt, len(attempts))
		for i, a := range attempts {
			reversed[len(attempts)-1-i] = a
		}
		eight := runOn(t, fleetDesktops(t, randomDesk(11), 8), task, reversed)
		if diff := cmp.Diff(one, eight); diff != "" {
			t.Errorf("1 desktop and 8 desktops in reverse order drew differently (-one +eight):\n%s", diff)
		}

		// The draws do vary, by attempt, by try and by seed.
		rewards, failed, resets := map[float64]bool{}, 0, map[time.Duration]bool{}
		for _, o := range one {
			rewards[o.Reward] = true
			failed += len(o.FailedObserves)
			resets[o.Took[fake.PhaseReset]] = true
		}
		if len(rewards) != 2 || failed == 0 || len(resets) != len(attempts) {
			t.Errorf("over %d attempts: rewards %v, %d failed observations, %d distinct reset times; want both rewards, some failures, all distinct",
				len(attempts), rewards, failed, len(resets))
		}
		tries := 0
		for a, o := range one {
			if a.Try == 0 {
				next := a
				next.Try = 1
				if !cmp.Equal(o, one[next]) {
					tries++
				}
			}
		}
		if tries == 0 {
			t.Error("every second try drew what its first try drew")
		}
		other := runOn(t, fleetDesktops(t, randomDesk(12), 1), task, attempts)
		if cmp.Equal(one, other) {
			t.Error("seeds 11 and 12 drew the same batch")
		}
	})
}

// TestDrawsWithoutAttempt checks the fallback for calls whose ctx carries
// no attempt: draws follow the desktop's own seed and call counts, so two
// slots of a fleet differ and the same slot repeats itself.
func TestDrawsWithoutAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		task := feasibleTask(t)
		run := func(d desktop.Desktop) []outcome {
			var outs []outcome
			for range 16 {
				outs = append(outs, runAttempt(t, t.Context(), d, task))
			}
			return outs
		}
		a, b := fleetDesktops(t, randomDesk(11), 2), fleetDesktops(t, randomDesk(11), 1)
		slot0, slot1, again := run(a[0]), run(a[1]), run(b[0])
		if diff := cmp.Diff(slot0, again); diff != "" {
			t.Errorf("slot 0 of two fleets with one seed drew differently (-first +second):\n%s", diff)
		}
		if cmp.Equal(slot0, slot1) {
			t.Error("slots 0 and 1 drew the same 16 attempts: the per-desktop seeds are not used")
		}
	})
}
