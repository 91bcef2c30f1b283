package fake_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

// kind names what an error from the fake is.
func kind(err error) string {
	switch {
	case errors.Is(err, desktop.ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, fake.ErrCrashed):
		return "crashed"
	case errors.Is(err, fake.ErrInjected):
		return "injected"
	case errors.Is(err, desktop.ErrUnsupported):
		return "unsupported"
	case errors.Is(err, fake.ErrNoTask):
		return "no task"
	}
	return "unexpected: " + err.Error()
}

// script runs one attempt per task the way a scheduler that never replaces
// its desktop would, each call bounded by a minute, and describes every
// call that failed: "attempt 2: reset: injected (failure)", where
// "(failure)" says that desktop.IsFailure holds.
func script(t *testing.T, d desktop.Desktop, tasks ...desktop.Task) []string {
	var failed []string
	for i, task := range tasks {
		calls := []func(ctx context.Context) error{
			func(ctx context.Context) error { return d.Reset(ctx, task) },
			d.WaitAfterReset,
			func(ctx context.Context) error { _, err := d.Observe(ctx); return err },
			func(ctx context.Context) error { _, err := d.Act(ctx, codeAction); return err },
			func(ctx context.Context) error { _, err := d.Act(ctx, desktop.DoneAction); return err },
			d.WaitBeforeEval,
			func(ctx context.Context) error { _, err := d.Evaluate(ctx, task); return err },
		}
		for _, call := range calls {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			err := call(ctx)
			failure := desktop.IsFailure(ctx, err)
			cancel()
			if err == nil {
				continue
			}
			var derr *desktop.Error
			if !errors.As(err, &derr) || derr.Desktop != "fake" {
				t.Fatalf("attempt %d: %v is not a *desktop.Error naming the desktop", i+1, err)
			}
			line := fmt.Sprintf("attempt %d: %s: %s", i+1, derr.Op, kind(err))
			if failure {
				line += " (failure)"
			}
			failed = append(failed, line)
			break
		}
	}
	return failed
}

func TestFaults(t *testing.T) {
	a, b := feasibleTask(t), infeasibleTask(t)
	for _, tc := range []struct {
		name   string
		faults []fake.Fault
		want   []string
	}{
		{"None", nil, nil},
		{
			"ResetErrorOnce",
			[]fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, OnCall: 2}},
			[]string{"attempt 2: reset: injected (failure)"},
		},
		{
			// Two acts per attempt: the third is the first of attempt 2.
			"ActErrorOnce",
			[]fake.Fault{{Phase: fake.PhaseAct, Kind: fake.FaultError, OnCall: 3}},
			[]string{"attempt 2: act: injected (failure)"},
		},
		{
			"CrashStaysCrashed",
			[]fake.Fault{{Phase: fake.PhaseObserve, Kind: fake.FaultCrash, OnCall: 2}},
			[]string{"attempt 2: observe: crashed (failure)", "attempt 3: reset: crashed (failure)"},
		},
		{
			// The caller gave up: not a failure of the desktop.
			"HangOnce",
			[]fake.Fault{{Phase: fake.PhaseWaitBeforeEval, Kind: fake.FaultHang, OnCall: 1}},
			[]string{"attempt 1: wait before eval: deadline"},
		},
		{
			"HangAlways",
			[]fake.Fault{{Phase: fake.PhaseEvaluate, Kind: fake.FaultHang, Prob: 1}},
			[]string{"attempt 1: evaluate: deadline", "attempt 2: evaluate: deadline", "attempt 3: evaluate: deadline"},
		},
		{
			"UnsupportedTask",
			[]fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultUnsupported, Prob: 1, Task: b.ID}},
			[]string{"attempt 2: reset: unsupported"},
		},
		{
			"TaskFilterUsesCurrentTask",
			[]fake.Fault{{Phase: fake.PhaseWaitAfterReset, Kind: fake.FaultError, Prob: 1, Task: a.ID}},
			[]string{"attempt 1: wait after reset: injected (failure)", "attempt 3: wait after reset: injected (failure)"},
		},
		{
			"OtherDesktopOnly",
			[]fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultCrash, Prob: 1, Desktop: "fake-1"}},
			nil,
		},
		{
			"FirstMatchWins",
			[]fake.Fault{
				{Phase: fake.PhaseReset, Kind: fake.FaultUnsupported, OnCall: 1},
				{Phase: fake.PhaseReset, Kind: fake.FaultCrash, OnCall: 1},
			},
			[]string{"attempt 1: reset: unsupported"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := fake.New(fake.Config{Width: 320, Height: 200, Faults: tc.faults})
				defer d.Close()
				if diff := cmp.Diff(tc.want, script(t, d, a, b, a)); diff != "" {
					t.Errorf("failed calls (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestCrashUntilClose(t *testing.T) {
	ctx := t.Context()
	d := fake.New(fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultCrash, OnCall: 1}}})
	task := feasibleTask(t)
	var got []string
	for range 2 {
		got = append(got, kind(d.Reset(ctx, task)))
	}
	_, err := d.Observe(ctx)
	got = append(got, kind(err))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	got = append(got, kind(d.Reset(ctx, task)))
	if diff := cmp.Diff([]string{"crashed", "crashed", "crashed", "closed"}, got); diff != "" {
		t.Errorf("calls after a crash (-want +got):\n%s", diff)
	}
}

// failingObserves returns the numbers of the Observe calls, out of n, that
// failed.
func failingObserves(t *testing.T, cfg fake.Config, n int) []int {
	d := fake.New(cfg)
	defer d.Close()
	if err := d.Reset(t.Context(), feasibleTask(t)); err != nil {
		t.Fatal(err)
	}
	var failed []int
	for i := range n {
		if _, err := d.Observe(t.Context()); err != nil {
			if !errors.Is(err, fake.ErrInjected) {
				t.Fatalf("Observe: %v, want ErrInjected", err)
			}
			failed = append(failed, i+1)
		}
	}
	return failed
}

func TestFaultProbability(t *testing.T) {
	cfg := fake.Config{Width: 64, Height: 64, Seed: 5, Faults: []fake.Fault{{Phase: fake.PhaseObserve, Kind: fake.FaultError, Prob: 0.25}}}
	const n = 800
	first, again := failingObserves(t, cfg, n), failingObserves(t, cfg, n)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("same seed, different failing calls (-first +again):\n%s", diff)
	}
	cfg.Seed = 6
	if other := failingObserves(t, cfg, n); cmp.Equal(first, other) {
		t.Error("seeds 5 and 6 failed the same calls")
	}
	// Binomial(800, 0.25) has a standard deviation of about 0.015.
	if rate := float64(len(first)) / n; rate < 0.19 || rate > 0.31 {
		t.Errorf("fault rate %.3f, want about 0.25", rate)
	}
}
