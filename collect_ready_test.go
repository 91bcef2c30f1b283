package rl

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestCollectReady checks the three ways to wait after an action: the
// generic ready signal (screenshots until two in a row are equal), the
// backend's own (desktop.ReadyWaiter) and fixed sleeps. The fake's screen
// keeps changing for 1 s after a reset and after each click.
func TestCollectReady(t *testing.T) {
	const settle = time.Second
	tests := []struct {
		name        string
		readyWaiter bool
		stepper     bool
		ready       desktop.ReadyOptions
		fixed       *desktop.FixedWaits
		// check gets each click's action record.
		check func(t *testing.T, ar schema.ActionRecord)
		// wantAfterReset, wantBeforeEval are the record's waits, seconds.
		wantAfterReset, wantBeforeEval float64
		// wantReadies is the number of WaitReady calls per attempt.
		wantReadies int
		// wantUnsettled: each click's wait ran out before the screen
		// settled, and the record and the summary say so.
		wantUnsettled bool
	}{
		{
			name:  "generic signal",
			ready: desktop.ReadyOptions{Interval: 100 * time.Millisecond, Max: 10 * time.Second},
			check: func(t *testing.T, ar schema.ActionRecord) {
				// The screen is still at 0.9 s and may be at 1 s; the
				// second equal screenshot comes one interval later.
				if ar.ReadyS < 1 || ar.ReadyS > 1.1+1e-9 || !near(ar.WaitS, ar.ReadyS+0.1) {
					t.Errorf("ready_s %v, wait_s %v: want ready in [1, 1.1] s, wait one interval longer", ar.ReadyS, ar.WaitS)
				}
			},
			wantAfterReset: 1, wantBeforeEval: 0,
		},
		{
			name:  "generic signal bounded by max",
			ready: desktop.ReadyOptions{Interval: 100 * time.Millisecond, Max: 450 * time.Millisecond},
			check: func(t *testing.T, ar schema.ActionRecord) {
				// Screenshots at 0, 0.1, ..., 0.4 s and at the bound,
				// 0.45 s, all differ; the bound ends the wait there.
				if !near(ar.ReadyS, 0.45) || !near(ar.WaitS, 0.45) {
					t.Errorf("ready_s %v, wait_s %v: want both 0.45 s, the last screenshot at max", ar.ReadyS, ar.WaitS)
				}
			},
			// The desktop's own wait before grading sees the rest of the
			// last click's settling.
			wantAfterReset: 1, wantBeforeEval: 0.55, wantUnsettled: true,
		},
		{
			name:        "backend signal",
			readyWaiter: true,
			ready:       desktop.ReadyOptions{Max: 10 * time.Second},
			check: func(t *testing.T, ar schema.ActionRecord) {
				if ar.ReadyS != 1 || ar.WaitS != 1 || ar.ObsS != 0 {
					t.Errorf("ready_s %v, wait_s %v, obs_s %v: want the backend's 1 s, then one screenshot", ar.ReadyS, ar.WaitS, ar.ObsS)
				}
			},
			wantAfterReset: 1, wantReadies: 2,
		},
		{
			name:        "backend signal bounded by max",
			readyWaiter: true,
			ready:       desktop.ReadyOptions{Max: 400 * time.Millisecond},
			check: func(t *testing.T, ar schema.ActionRecord) {
				if !near(ar.ReadyS, 0.4) || !near(ar.WaitS, 0.4) {
					t.Errorf("ready_s %v, wait_s %v: want both the 0.4 s bound", ar.ReadyS, ar.WaitS)
				}
			},
			wantAfterReset: 1, wantBeforeEval: 0.6, wantReadies: 2, wantUnsettled: true,
		},
		{
			name:        "backend step",
			readyWaiter: true, stepper: true,
			ready: desktop.ReadyOptions{Max: 10 * time.Second},
			check: func(t *testing.T, ar schema.ActionRecord) {
				// Act 0.5 s, the wait 1 s, the screenshot 0.25 s, all
				// in one call; the screenshot's capture is its time.
				if ar.ActS != 0.5 || ar.ReadyS != 1 || ar.WaitS != 1 || ar.ObsS != 0.25 || ar.CaptureS != 0.25 || ar.TransferS != 0 {
					t.Errorf("act_s %v, ready_s %v, wait_s %v, obs_s %v, capture_s %v, transfer_s %v: want 0.5, 1, 1, 0.25, 0.25, 0",
						ar.ActS, ar.ReadyS, ar.WaitS, ar.ObsS, ar.CaptureS, ar.TransferS)
				}
			},
			wantAfterReset: 1, wantReadies: 2,
		},
		{
			name:        "fixed waits",
			readyWaiter: true, // and yet not used
			fixed:       &desktop.FixedWaits{AfterAction: 3 * time.Second, AfterReset: 60 * time.Second, BeforeEval: 20 * time.Second},
			check: func(t *testing.T, ar schema.ActionRecord) {
				if ar.ReadyS != 0 || ar.WaitS != 3 {
					t.Errorf("ready_s %v, wait_s %v: want no ready time, 3 s wait", ar.ReadyS, ar.WaitS)
				}
			},
			wantAfterReset: 60, wantBeforeEval: 20,
		},
		{
			name:  "fixed wait after actions only",
			fixed: &desktop.FixedWaits{AfterAction: 2 * time.Second},
			check: func(t *testing.T, ar schema.ActionRecord) {
				if ar.ReadyS != 0 || ar.WaitS != 2 {
					t.Errorf("ready_s %v, wait_s %v: want no ready time, 2 s wait", ar.ReadyS, ar.WaitS)
				}
			},
			// Each fixed wait is only what its option says: none after
			// a reset or before grading.
			wantAfterReset: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fake.Config{ReadyWaiter: tt.readyWaiter, Stepper: tt.stepper, Latency: fake.Latencies{Settle: fake.Latency{Fixed: settle}}}
				if tt.stepper {
					cfg.Latency.Act = fake.Latency{Fixed: 500 * time.Millisecond}
					cfg.Latency.Observe = fake.Latency{Fixed: 250 * time.Millisecond}
				}
				e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(2)}, cfg)
				e.opts.Desktops, e.opts.Group = 1, 1
				e.opts.Ready = tt.ready
				if tt.fixed != nil {
					e.opts.NewDesktop = desktop.WithFixedWaits(e.opts.NewDesktop, *tt.fixed)
				}
				sum, err := e.collect(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				recs := checkBatch(t, e, sum, true)
				if len(recs) != 1 || recs[0].Status != StatusOK || recs[0].NSteps != 3 {
					t.Fatalf("records %+v: want one ok record of 3 steps", recs)
				}
				r := recs[0]
				for i, s := range r.Steps[:2] {
					if len(s.Actions) != 1 || !strings.HasPrefix(s.Actions[0].Action, "pyautogui.click(") {
						t.Fatalf("step %d actions %+v, want one click", i, s.Actions)
					}
					tt.check(t, s.Actions[0])
					if s.Actions[0].Unsettled != tt.wantUnsettled {
						t.Errorf("step %d: unsettled %v, want %v", i, s.Actions[0].Unsettled, tt.wantUnsettled)
					}
				}
				wantUnsettled := 0
				if tt.wantUnsettled {
					wantUnsettled = 2
				}
				warned := slices.ContainsFunc(sum.Warnings, func(w string) bool { return strings.Contains(w, "before the screen settled") })
				if sum.UnsettledWaits != wantUnsettled || warned != tt.wantUnsettled {
					t.Errorf("summary: %d unsettled waits, warnings %q; want %d, a warning %v", sum.UnsettledWaits, sum.Warnings, wantUnsettled, tt.wantUnsettled)
				}
				if done := r.Steps[2].Actions; len(done) != 1 || done[0].Action != desktop.DoneCode || done[0].WaitS != 0 {
					t.Errorf("last step's actions %+v: want DONE, with no wait", done)
				}
				if r.Timing.WaitAfterResetS != tt.wantAfterReset || r.Timing.WaitBeforeEvalS != tt.wantBeforeEval {
					t.Errorf("waits after reset %v s, before eval %v s; want %v s, %v s", r.Timing.WaitAfterResetS, r.Timing.WaitBeforeEvalS, tt.wantAfterReset, tt.wantBeforeEval)
				}
				if got := e.fleet.Stats().WaitReadies; got != tt.wantReadies {
					t.Errorf("%d WaitReady calls, want %d", got, tt.wantReadies)
				}
				// The record's action waits add up in its timing.
				var wait, obs float64
				for _, s := range r.Steps {
					for _, a := range s.Actions {
						wait += a.WaitS
						obs += a.ObsS
					}
				}
				if !near(r.Timing.WaitS, wait) || r.Timing.ObsS < obs {
					t.Errorf("timing %+v: wait_s is not the actions' %v, or obs_s below their %v", r.Timing, wait, obs)
				}
			})
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// unsettledStartDesktop is a fake desktop whose attempts at task start
// before the screen settled, as its report says.
type unsettledStartDesktop struct {
	desktop.Desktop
	task, cur string
}

func (u *unsettledStartDesktop) Reset(ctx context.Context, task desktop.Task) error {
	u.cur = task.ID
	return u.Desktop.Reset(ctx, task)
}

func (u *unsettledStartDesktop) AttemptReport() desktop.AttemptReport {
	return desktop.AttemptReport{UnsettledStart: u.cur == u.task}
}

// TestCollectUnsettledStart: an attempt whose desktop says its start did
// not settle is recorded so (env.unsettled_start), counted in the summary
// and warned of; the others say nothing of it.
func TestCollectUnsettledStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{Script: clicksThenDone(1)}, fake.Config{})
		e.opts.Desktops = 1
		newDesktop := e.opts.NewDesktop
		e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := newDesktop(ctx, slot)
			if err != nil {
				return nil, err
			}
			return &unsettledStartDesktop{Desktop: d, task: "t1"}, nil
		}
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		recs := checkBatch(t, e, sum, true)
		want := 0
		for _, r := range recs {
			if got := r.Env != nil && r.Env.UnsettledStart; got != (r.TaskID == "t1") {
				t.Errorf("task %s: env %+v; want unsettled_start only on t1", r.TaskID, r.Env)
			}
			if r.TaskID == "t1" {
				want++
			}
		}
		if want == 0 {
			t.Fatal("no attempt at t1 was recorded")
		}
		warned := slices.ContainsFunc(sum.Warnings, func(w string) bool { return strings.Contains(w, "started before the screen settled") })
		if sum.UnsettledStarts != want || !warned {
			t.Errorf("summary: %d unsettled starts, warnings %q; want %d, and a warning", sum.UnsettledStarts, sum.Warnings, want)
		}
	})
}
