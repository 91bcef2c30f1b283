package desktop_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var settlingTask = desktop.Task{ID: "t", Evaluator: []byte(`{"func":"exact_match"}`)}

func click() desktop.Action { return desktop.Action{Kind: desktop.Code, Code: "pyautogui.click(1, 1)"} }

// TestWaitReadyGeneric: on a desktop without its own signal, the wait ends
// at the second identical screenshot and returns it; a screen that keeps
// changing ends the wait at max exactly, with the last screenshot.
func TestWaitReadyGeneric(t *testing.T) {
	for _, tc := range []struct {
		name        string
		max         time.Duration
		wantAfter   time.Duration
		wantSettled bool
	}{
		{"settles", 10 * time.Second, 1100 * time.Millisecond, true},
		{"bounded", 450 * time.Millisecond, 450 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := t.Context()
				d := fake.New(fake.Config{Width: 64, Height: 48, Latency: fake.Latencies{Settle: fake.Latency{Fixed: time.Second}}})
				defer d.Close()
				if err := d.Reset(ctx, settlingTask); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Second)
				if _, err := d.Act(ctx, click()); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				r, err := desktop.WaitReady(ctx, d, desktop.ReadyOptions{Interval: 100 * time.Millisecond, Max: tc.max})
				if err != nil {
					t.Fatal(err)
				}
				// The settling screen changes on every look; once still, the
				// first still screenshot (at 1 s or the look after it) and
				// the next one match.
				if r.Settled != tc.wantSettled || (tc.wantSettled && (r.After < time.Second || r.After > tc.wantAfter)) || (!tc.wantSettled && r.After != tc.wantAfter) {
					t.Errorf("WaitReady: after %v, settled %v; want %v, %v", r.After, r.Settled, tc.wantAfter, tc.wantSettled)
				}
				if waited := time.Since(start); waited > tc.max {
					t.Errorf("WaitReady took %v, more than its max %v", waited, tc.max)
				}
				if len(r.Observation.Screenshot) == 0 || r.Observation.At.Before(start) {
					t.Errorf("WaitReady's observation: %d bytes at %v, want the last screenshot of the wait", len(r.Observation.Screenshot), r.Observation.At)
				}
			})
		})
	}
}

// TestWithFixedWaits: every wait is its fixed sleep and nothing else, and
// the desktop's own ready signal is not used.
func TestWithFixedWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		inner := fake.Factory(fake.Config{Width: 64, Height: 48, ReadyWaiter: true, Latency: fake.Latencies{Settle: fake.Latency{Fixed: time.Minute}}})
		w := desktop.FixedWaits{AfterReset: 5 * time.Second, AfterAction: 2 * time.Second}
		d, err := desktop.WithFixedWaits(inner, w)(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := d.Reset(ctx, settlingTask); err != nil {
			t.Fatal(err)
		}
		took := func(f func() error) time.Duration {
			t.Helper()
			start := time.Now()
			if err := f(); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		if got := took(func() error { return d.WaitAfterReset(ctx) }); got != w.AfterReset {
			t.Errorf("WaitAfterReset took %v, want %v", got, w.AfterReset)
		}
		var r desktop.Ready
		if got := took(func() (err error) {
			r, err = desktop.WaitReady(ctx, d, desktop.ReadyOptions{Max: time.Second})
			return err
		}); got != w.AfterAction {
			t.Errorf("WaitReady took %v, want the fixed %v whatever max says", got, w.AfterAction)
		}
		if r.Settled || r.After != 0 || len(r.Observation.Screenshot) == 0 {
			t.Errorf("fixed WaitReady = settled %v after %v with %d bytes; want unsettled, 0, a screenshot", r.Settled, r.After, len(r.Observation.Screenshot))
		}
		if got := took(func() error { return d.WaitBeforeEval(ctx) }); got != 0 {
			t.Errorf("WaitBeforeEval took %v, want 0 (not set)", got)
		}
	})
}

func TestAttemptInContext(t *testing.T) {
	if _, ok := desktop.AttemptFrom(t.Context()); ok {
		t.Error("a bare ctx carries an attempt")
	}
	want := desktop.Attempt{GroupID: "v/t", TaskID: "t", Index: 3, Try: 1}
	got, ok := desktop.AttemptFrom(desktop.WithAttempt(t.Context(), want))
	if !ok || got != want {
		t.Errorf("AttemptFrom = %+v, %v; want %+v", got, ok, want)
	}
}

func TestReadyOptionsValidate(t *testing.T) {
	if err := (desktop.ReadyOptions{}).Validate(); err != nil {
		t.Errorf("zero options: %v", err)
	}
	for _, o := range []desktop.ReadyOptions{{Interval: -1}, {Max: -1}, {Stable: 1}, {Stable: -2}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (desktop.FixedWaits{BeforeEval: -time.Second}).Validate(); err == nil {
		t.Error("negative fixed wait: no error")
	}
}

type reportingDesktop struct{ desktop.Desktop }

func (reportingDesktop) AttemptReport() desktop.AttemptReport {
	return desktop.AttemptReport{Reset: "fast", ResetWhy: "cheapest here"}
}

// TestWithFixedWaitsKeepsReports: the fixed-wait baseline still passes on
// what the desktop says of each attempt.
func TestWithFixedWaitsKeepsReports(t *testing.T) {
	inner := func(context.Context, int) (desktop.Desktop, error) {
		return reportingDesktop{fake.New(fake.Config{Width: 64, Height: 48})}, nil
	}
	d, err := desktop.WithFixedWaits(inner, desktop.FixedWaits{})(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r, ok := d.(desktop.Reporter)
	if !ok || r.AttemptReport().Reset != "fast" {
		t.Errorf("the wrapped desktop's report is lost (Reporter %v)", ok)
	}
}

// retiringDesktop asks to be replaced while retire is set.
type retiringDesktop struct {
	desktop.Desktop
	retire *bool
}

func (d retiringDesktop) Retiring() bool { return *d.retire }

// TestWithFixedWaitsKeepsRetiring: the fixed-wait baseline asks to be
// replaced when, and only when, the desktop whose waits it replaced does.
func TestWithFixedWaitsKeepsRetiring(t *testing.T) {
	retire := false
	d, err := desktop.WithFixedWaits(func(context.Context, int) (desktop.Desktop, error) {
		return retiringDesktop{fake.New(fake.Config{Width: 64, Height: 48}), &retire}, nil
	}, desktop.FixedWaits{})(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r, ok := d.(desktop.Retirer)
	if !ok {
		t.Fatal("the fixed-wait desktop is no Retirer")
	}
	for _, retire = range []bool{false, true} {
		if got := r.Retiring(); got != retire {
			t.Errorf("Retiring = %v with the wrapped desktop's %v", got, retire)
		}
	}
	plain, err := desktop.WithFixedWaits(func(context.Context, int) (desktop.Desktop, error) {
		return fake.New(fake.Config{Width: 64, Height: 48}), nil
	}, desktop.FixedWaits{})(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if plain.(desktop.Retirer).Retiring() {
		t.Error("a desktop that cannot retire asks to, behind fixed waits")
	}
}

// placingDesktop starts attempts at task "near" fastest.
type placingDesktop struct{ desktop.Desktop }

func (placingDesktop) Affinity(taskID string) desktop.Affinity {
	if taskID == "near" {
		return desktop.HereFaster
	}
	return desktop.ElsewhereFaster
}

// TestWithFixedWaitsKeepsAffinity: the fixed-wait baseline says where a
// task's attempts start fastest as the desktop whose waits it replaced
// does, and knows nothing of a desktop that says nothing.
func TestWithFixedWaitsKeepsAffinity(t *testing.T) {
	for _, tc := range []struct {
		name       string
		inner      func() desktop.Desktop
		near, away desktop.Affinity
	}{
		{"placer", func() desktop.Desktop { return placingDesktop{fake.New(fake.Config{Width: 64, Height: 48})} }, desktop.HereFaster, desktop.ElsewhereFaster},
		{"plain", func() desktop.Desktop { return fake.New(fake.Config{Width: 64, Height: 48}) }, desktop.AnyDesktop, desktop.AnyDesktop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := desktop.WithFixedWaits(func(context.Context, int) (desktop.Desktop, error) { return tc.inner(), nil }, desktop.FixedWaits{})(t.Context(), 0)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			p, ok := d.(desktop.Placer)
			if !ok {
				t.Fatal("the fixed-wait desktop is no Placer")
			}
			if got := p.Affinity("near"); got != tc.near {
				t.Errorf("Affinity(near) = %v, want %v", got, tc.near)
			}
			if got := p.Affinity("away"); got != tc.away {
				t.Errorf("Affinity(away) = %v, want %v", got, tc.away)
			}
		})
	}
}

// TestWithFixedWaitsKeepsGrading: the fixed-wait baseline grades twice,
// explains its grade and keeps and regrades end states as the desktop
// whose waits it replaced.
func TestWithFixedWaitsKeepsGrading(t *testing.T) {
	cfg := fake.Config{Width: 64, Height: 48, EndStates: t.TempDir(), DefaultReward: fake.Reward{P: 1}}
	d, err := desktop.WithFixedWaits(func(context.Context, int) (desktop.Desktop, error) { return fake.New(cfg), nil }, desktop.FixedWaits{})(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := t.Context()
	task := desktop.Task{ID: "t", Instruction: "x", Evaluator: []byte(`{"func":"exact_match"}`)}
	if err := d.Reset(ctx, task); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Act(ctx, desktop.DoneAction); err != nil {
		t.Fatal(err)
	}
	s, err := d.(desktop.EndStateKeeper).KeepEndState(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := d.Evaluate(ctx, task); err != nil || r != 1 {
		t.Errorf("Evaluate: %v, %v; want 1", r, err)
	}
	if why := d.(desktop.GradeExplainer).ExplainGrade(); !strings.Contains(why, "drew a success") {
		t.Errorf("ExplainGrade: %q, want the fake's reason for its 1", why)
	}
	again, err := d.(desktop.Regrader).EvaluateAgain(ctx, task)
	if err != nil || again != 1 {
		t.Errorf("EvaluateAgain: %v, %v; want 1", again, err)
	}
	r, err := d.(desktop.EndStateGrader).GradeEndState(ctx, s.Ref, task, desktop.DoneAction)
	if err != nil || r != 1 {
		t.Errorf("GradeEndState: %v, %v; want 1", r, err)
	}
	if err := d.(desktop.EndStateKeeper).DropEndState(ctx, s.Ref); err != nil {
		t.Errorf("DropEndState: %v", err)
	}
}
