package fake_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

// Tests here run in testing/synctest bubbles: time is the bubble's fake
// clock, so durations are exact and hours pass instantly.

// timedAttempt runs an attempt with one Code action and returns how long
// each call took, by phase.
func timedAttempt(t *testing.T, d desktop.Desktop, task desktop.Task) map[fake.Phase]time.Duration {
	t.Helper()
	ctx := t.Context()
	took := make(map[fake.Phase]time.Duration)
	timed := func(p fake.Phase, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if d := time.Since(start); d != 0 {
			took[p] += d
		}
	}
	timed(fake.PhaseReset, func() error { return d.Reset(ctx, task) })
	timed(fake.PhaseWaitAfterReset, func() error { return d.WaitAfterReset(ctx) })
	timed(fake.PhaseObserve, func() error { _, err := d.Observe(ctx); return err })
	timed(fake.PhaseAct, func() error { _, err := d.Act(ctx, codeAction); return err })
	timed(fake.PhaseWaitBeforeEval, func() error { return d.WaitBeforeEval(ctx) })
	timed(fake.PhaseEvaluate, func() error { _, err := d.Evaluate(ctx, task); return err })
	return took
}

func TestLatencyPerPhase(t *testing.T) {
	seven := fake.Latency{Fixed: 7 * time.Second}
	for _, tc := range []struct {
		name string
		set  func(*fake.Latencies)
		want map[fake.Phase]time.Duration
	}{
		{"None", func(*fake.Latencies) {}, map[fake.Phase]time.Duration{}},
		{"Reset", func(l *fake.Latencies) { l.Reset = seven }, map[fake.Phase]time.Duration{fake.PhaseReset: 7 * time.Second}},
		{"WaitAfterReset", func(l *fake.Latencies) { l.WaitAfterReset = seven }, map[fake.Phase]time.Duration{fake.PhaseWaitAfterReset: 7 * time.Second}},
		{"Observe", func(l *fake.Latencies) { l.Observe = seven }, map[fake.Phase]time.Duration{fake.PhaseObserve: 7 * time.Second}},
		{"Act", func(l *fake.Latencies) { l.Act = seven }, map[fake.Phase]time.Duration{fake.PhaseAct: 7 * time.Second}},
		{"WaitBeforeEval", func(l *fake.Latencies) { l.WaitBeforeEval = seven }, map[fake.Phase]time.Duration{fake.PhaseWaitBeforeEval: 7 * time.Second}},
		{"Evaluate", func(l *fake.Latencies) { l.Evaluate = seven }, map[fake.Phase]time.Duration{fake.PhaseEvaluate: 7 * time.Second}},
		{
			// The screen settles after Reset and after the Code action;
			// the waits wait for it.
			"Settle", func(l *fake.Latencies) { l.Settle = seven },
			map[fake.Phase]time.Duration{fake.PhaseWaitAfterReset: 7 * time.Second, fake.PhaseWaitBeforeEval: 7 * time.Second},
		},
		{
			// A wait's own latency counts toward the settling.
			"WaitOverlapsSettle", func(l *fake.Latencies) { l.Settle = seven; l.WaitAfterReset = fake.Latency{Fixed: 5 * time.Second} },
			map[fake.Phase]time.Duration{fake.PhaseWaitAfterReset: 7 * time.Second, fake.PhaseWaitBeforeEval: 7 * time.Second},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fake.Config{Width: 64, Height: 64}
				tc.set(&cfg.Latency)
				d := fake.New(cfg)
				defer d.Close()
				if diff := cmp.Diff(tc.want, timedAttempt(t, d, feasibleTask(t))); diff != "" {
					t.Errorf("call durations (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestLatencyDrawsReproducible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fake.Config{Width: 64, Height: 64, Seed: 9, Latency: fake.Latencies{
			Reset:  fake.Latency{Median: time.Second, Sigma: 1},
			Act:    fake.Latency{Scale: time.Second, Alpha: 1.2},
			Settle: fake.Latency{Min: time.Second, Max: 3 * time.Second},
		}}
		a, b := fake.New(cfg), fake.New(cfg)
		defer a.Close()
		defer b.Close()
		task := feasibleTask(t)
		for i := range 3 {
			ta, tb := timedAttempt(t, a, task), timedAttempt(t, b, task)
			if diff := cmp.Diff(ta, tb); diff != "" {
				t.Errorf("attempt %d: same seed, different durations (-a +b):\n%s", i, diff)
			}
			if len(ta) != 4 { // reset, act and the two settle waits
				t.Errorf("attempt %d: durations %v, want four phases that took time", i, ta)
			}
		}
	})
}

func TestCancelDuringLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := fake.New(fake.Config{Latency: fake.Latencies{Reset: fake.Latency{Fixed: time.Hour}}})
		defer d.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		err := d.Reset(ctx, feasibleTask(t))
		if took := time.Since(start); took != 10*time.Second {
			t.Errorf("Reset returned after %v, want 10s (the ctx's deadline)", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Reset: %v, want an error wrapping context.DeadlineExceeded", err)
		}
		if desktop.IsFailure(ctx, err) {
			t.Errorf("IsFailure(%v) after the ctx expired, want false", err)
		}
	})
}

func TestCloseInterruptsLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := fake.New(fake.Config{Latency: fake.Latencies{WaitAfterReset: fake.Latency{Fixed: time.Hour}}})
		if err := d.Reset(t.Context(), feasibleTask(t)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- d.WaitAfterReset(t.Context()) }()
		synctest.Wait() // the wait is under way
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, desktop.ErrClosed) {
			t.Errorf("WaitAfterReset interrupted by Close: %v, want ErrClosed", err)
		}
	})
}

func TestSettlingScreen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		d := fake.New(fake.Config{Width: 320, Height: 200, Latency: fake.Latencies{Settle: fake.Latency{Fixed: 10 * time.Second}}})
		defer d.Close()
		if err := d.Reset(ctx, feasibleTask(t)); err != nil {
			t.Fatal(err)
		}
		shot := func() []byte {
			t.Helper()
			obs, err := d.Observe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return obs.Screenshot
		}

		// Settling: every frame differs from every other.
		var frames [][]byte
		for range 8 {
			frames = append(frames, shot())
			time.Sleep(time.Second)
		}
		for i := range frames {
			for j := range i {
				if bytes.Equal(frames[i], frames[j]) {
					t.Errorf("settling frames %d and %d are equal", j, i)
				}
			}
		}
		// Settled: the same frame every time, unlike any settling one.
		time.Sleep(2 * time.Second)
		stable := shot()
		if !bytes.Equal(stable, shot()) {
			t.Error("two frames after settling differ")
		}
		for i, f := range frames {
			if bytes.Equal(stable, f) {
				t.Errorf("settled frame equals settling frame %d", i)
			}
		}
		// A Code action changes the settled screen; WAIT does not.
		if _, err := d.Act(ctx, desktop.WaitAction); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stable, shot()) {
			t.Error("WAIT changed the screen")
		}
		if _, err := d.Act(ctx, codeAction); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if bytes.Equal(stable, shot()) {
			t.Error("a Code action left the settled screen unchanged")
		}
	})
}

func TestWaitReady(t *testing.T) {
	for _, tc := range []struct {
		name    string
		max     time.Duration
		sleep   time.Duration // between Act and WaitReady
		want    time.Duration
		settled bool
	}{
		{"WaitsForSettle", time.Minute, 0, 4 * time.Second, true},
		{"PartlySettled", time.Minute, 3 * time.Second, time.Second, true},
		{"Settled", time.Minute, 5 * time.Second, 0, true},
		{"BoundedByMax", time.Second, 0, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := t.Context()
				d := fake.New(fake.Config{Width: 320, Height: 200, ReadyWaiter: true,
					Latency: fake.Latencies{Settle: fake.Latency{Fixed: 4 * time.Second}}})
				defer d.Close()
				if err := d.Reset(ctx, feasibleTask(t)); err != nil {
					t.Fatal(err)
				}
				if err := d.WaitAfterReset(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := d.Act(ctx, codeAction); err != nil {
					t.Fatal(err)
				}
				time.Sleep(tc.sleep)
				r, err := d.AsConfigured().(desktop.ReadyWaiter).WaitReady(ctx, tc.max)
				if err != nil {
					t.Fatal(err)
				}
				if r.After != tc.want || r.Settled != tc.settled {
					t.Errorf("WaitReady: after %v, settled %v; want %v, %v", r.After, r.Settled, tc.want, tc.settled)
				}
				b, _ := d.Observe(ctx)
				if settled := bytes.Equal(r.Observation.Screenshot, b.Screenshot); settled != tc.settled {
					t.Errorf("screen settled after WaitReady: %v, want %v", settled, tc.settled)
				}
			})
		})
	}
}
