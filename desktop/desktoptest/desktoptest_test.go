package desktoptest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Small screens keep the PNGs cheap; the size is not what is tested here.
const width, height = 320, 200

func newFake() desktop.Desktop { return fake.New(fake.Config{Width: width, Height: height}) }

// hangingFake is a fake on which method m blocks until its ctx is done or
// the desktop closed.
func hangingFake(m Method) desktop.Desktop {
	phase := map[Method]fake.Phase{
		MethodReset:          fake.PhaseReset,
		MethodWaitAfterReset: fake.PhaseWaitAfterReset,
		MethodObserve:        fake.PhaseObserve,
		MethodAct:            fake.PhaseAct,
		MethodWaitBeforeEval: fake.PhaseWaitBeforeEval,
		MethodEvaluate:       fake.PhaseEvaluate,
	}[m]
	return fake.New(fake.Config{Width: width, Height: height, Faults: []fake.Fault{{Phase: phase, Kind: fake.FaultHang, Prob: 1}}})
}

func fakeBlocking(_ context.Context, m Method) (desktop.Desktop, error) { return hangingFake(m), nil }

// wrap returns a newDesktop for Check that wraps fakes with w.
func wrap(w func(desktop.Desktop) desktop.Desktop) func(context.Context) (desktop.Desktop, error) {
	return func(context.Context) (desktop.Desktop, error) { return w(newFake()), nil }
}

// wrapBlocking returns an Options.Blocking that wraps hanging fakes with w.
func wrapBlocking(w func(desktop.Desktop) desktop.Desktop) func(context.Context, Method) (desktop.Desktop, error) {
	return func(_ context.Context, m Method) (desktop.Desktop, error) { return w(hangingFake(m)), nil }
}

// Broken desktops: each embeds a working one and breaks one rule.

// badStepper steps by Act then Observe, but says the action took an hour
// and hands back a screen for DONE.
type badStepper struct{ desktop.Desktop }

func (d badStepper) Step(ctx context.Context, a desktop.Action, _ time.Duration) (desktop.StepResult, error) {
	res, err := d.Act(ctx, a)
	if err != nil {
		return desktop.StepResult{}, err
	}
	obs, err := d.Observe(ctx)
	return desktop.StepResult{Act: res, Ready: desktop.Ready{Observation: obs}, ActTime: time.Hour}, err
}

// goodStepper steps by Act then Observe.
type goodStepper struct{ desktop.Desktop }

func (d goodStepper) Step(ctx context.Context, a desktop.Action, _ time.Duration) (desktop.StepResult, error) {
	res, err := d.Act(ctx, a)
	if err != nil || a.Terminal() {
		return desktop.StepResult{Act: res}, err
	}
	obs, err := d.Observe(ctx)
	return desktop.StepResult{Act: res, Ready: desktop.Ready{Observation: obs}}, err
}

// codeOnlyStepper returns no screen after WAIT: it steps Code actions only.
type codeOnlyStepper struct{ desktop.Desktop }

func (d codeOnlyStepper) Step(ctx context.Context, a desktop.Action, _ time.Duration) (desktop.StepResult, error) {
	res, err := d.Act(ctx, a)
	if err != nil || a.Kind != desktop.Code {
		return desktop.StepResult{Act: res}, err
	}
	obs, err := d.Observe(ctx)
	return desktop.StepResult{Act: res, Ready: desktop.Ready{Observation: obs}}, err
}

// wrongSize declares a screen one pixel wider than its PNG.
type wrongSize struct{ desktop.Desktop }

func (d wrongSize) Observe(ctx context.Context) (desktop.Observation, error) {
	obs, err := d.Desktop.Observe(ctx)
	obs.Width++
	return obs, err
}

// notPNG returns a GIF header for a screenshot.
type notPNG struct{ desktop.Desktop }

func (d notPNG) Observe(ctx context.Context) (desktop.Observation, error) {
	obs, err := d.Desktop.Observe(ctx)
	obs.Screenshot = []byte("GIF89a")
	return obs, err
}

// fixedReward grades every attempt the same.
type fixedReward struct {
	desktop.Desktop
	r float64
}

func (d fixedReward) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	if _, err := d.Desktop.Evaluate(ctx, task); err != nil {
		return 0, err
	}
	return d.r, nil
}

// stickyFail remembers a FAIL across Resets, so that an infeasible task
// scores 1 forever after the first FAIL.
type stickyFail struct {
	desktop.Desktop
	failed bool
}

func (d *stickyFail) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	d.failed = d.failed || a.Kind == desktop.Fail
	return d.Desktop.Act(ctx, a)
}

func (d *stickyFail) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	if _, err := d.Desktop.Evaluate(ctx, task); err != nil {
		return 0, err
	}
	if d.failed {
		return 1, nil
	}
	return 0, nil
}

// rejectsWait fails on WAIT as if the guest had died.
type rejectsWait struct{ desktop.Desktop }

func (d rejectsWait) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	if a.Kind == desktop.Wait {
		return desktop.ActResult{}, errors.New("guest server: 500")
	}
	return d.Desktop.Act(ctx, a)
}

// closeOnce fails the second Close.
type closeOnce struct {
	desktop.Desktop
	closed atomic.Bool
}

func (d *closeOnce) Close() error {
	if d.closed.Swap(true) {
		return errors.New("already closed")
	}
	return d.Desktop.Close()
}

// errMapper rewrites the errors of method only, or of every blocking
// method if only is "".
type errMapper struct {
	desktop.Desktop
	only Method
	f    func(ctx context.Context, err error) error
}

func (d errMapper) mapErr(m Method, ctx context.Context, err error) error {
	if d.only != "" && d.only != m {
		return err
	}
	return d.f(ctx, err)
}

func (d errMapper) Reset(ctx context.Context, task desktop.Task) error {
	return d.mapErr(MethodReset, ctx, d.Desktop.Reset(ctx, task))
}

func (d errMapper) WaitAfterReset(ctx context.Context) error {
	return d.mapErr(MethodWaitAfterReset, ctx, d.Desktop.WaitAfterReset(ctx))
}

func (d errMapper) Observe(ctx context.Context) (desktop.Observation, error) {
	obs, err := d.Desktop.Observe(ctx)
	return obs, d.mapErr(MethodObserve, ctx, err)
}

func (d errMapper) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	res, err := d.Desktop.Act(ctx, a)
	return res, d.mapErr(MethodAct, ctx, err)
}

func (d errMapper) WaitBeforeEval(ctx context.Context) error {
	return d.mapErr(MethodWaitBeforeEval, ctx, d.Desktop.WaitBeforeEval(ctx))
}

func (d errMapper) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	r, err := d.Desktop.Evaluate(ctx, task)
	return r, d.mapErr(MethodEvaluate, ctx, err)
}

// hidesErrClosed reports a closed desktop with an error of its own.
func hidesErrClosed(_ context.Context, err error) error {
	if errors.Is(err, desktop.ErrClosed) {
		return errors.New("gone")
	}
	return err
}

// ignoresCancel is a desktop whose WaitAfterReset goes on waiting (until
// Close) once its ctx is cancelled; with blocking, it always waits until
// Close, without looking at its ctx.
type ignoresCancel struct {
	desktop.Desktop
	blocking  bool
	closed    chan struct{}
	closeOnce sync.Once
}

func newIgnoresCancel(d desktop.Desktop, blocking bool) *ignoresCancel {
	return &ignoresCancel{Desktop: d, blocking: blocking, closed: make(chan struct{})}
}

func (d *ignoresCancel) WaitAfterReset(ctx context.Context) error {
	if d.blocking || ctx.Err() != nil {
		<-d.closed
		return nil
	}
	return d.Desktop.WaitAfterReset(ctx)
}

func (d *ignoresCancel) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	return d.Desktop.Close()
}

// ctxBlind is a desktop that never looks at its ctx: every call runs to its
// end however it is interrupted, as a desktop that does not block does.
type ctxBlind struct{ desktop.Desktop }

func (d ctxBlind) Reset(ctx context.Context, task desktop.Task) error {
	return d.Desktop.Reset(context.WithoutCancel(ctx), task)
}

func (d ctxBlind) WaitAfterReset(ctx context.Context) error {
	return d.Desktop.WaitAfterReset(context.WithoutCancel(ctx))
}

func (d ctxBlind) Observe(ctx context.Context) (desktop.Observation, error) {
	return d.Desktop.Observe(context.WithoutCancel(ctx))
}

func (d ctxBlind) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	return d.Desktop.Act(context.WithoutCancel(ctx), a)
}

func (d ctxBlind) WaitBeforeEval(ctx context.Context) error {
	return d.Desktop.WaitBeforeEval(context.WithoutCancel(ctx))
}

func (d ctxBlind) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	return d.Desktop.Evaluate(context.WithoutCancel(ctx), task)
}

// deafToClose is a desktop whose Observe blocks until its ctx is done,
// whether or not the desktop is closed.
type deafToClose struct{ desktop.Desktop }

func (d deafToClose) Observe(ctx context.Context) (desktop.Observation, error) {
	<-ctx.Done()
	return desktop.Observation{}, ctx.Err()
}

// leaksOnWait starts a goroutine on WAIT that outlives the desktop; it ends
// when release is closed.
type leaksOnWait struct {
	desktop.Desktop
	release chan struct{}
	wg      *sync.WaitGroup
}

func (d leaksOnWait) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	if a.Kind == desktop.Wait {
		d.wg.Go(func() { <-d.release })
	}
	return d.Desktop.Act(ctx, a)
}

// failed returns the names of the checks that failed, once each, in order.
func failed(fails []Failure) []string {
	var names []string
	for _, f := range fails {
		if !slices.Contains(names, f.Check) {
			names = append(names, f.Check)
		}
	}
	return names
}

// checksWith returns the names of the checks with one of prefixes, in
// order.
func checksWith(prefixes ...string) []string {
	var names []string
	for _, n := range CheckNames() {
		for _, p := range prefixes {
			if strings.HasPrefix(n, p) {
				names = append(names, n)
				break
			}
		}
	}
	return names
}

func TestCheck(t *testing.T) {
	release := make(chan struct{})
	var leaked sync.WaitGroup
	t.Cleanup(func() {
		close(release)
		leaked.Wait()
	})

	for _, tc := range []struct {
		name       string
		newDesktop func(context.Context) (desktop.Desktop, error)
		opts       Options
		want       []string // failed checks
	}{
		{"Fake", wrap(func(d desktop.Desktop) desktop.Desktop { return d }), Options{Blocking: fakeBlocking}, nil},
		{"FakeWithoutBlocking", wrap(func(d desktop.Desktop) desktop.Desktop { return d }), Options{}, nil},
		{
			"FakeWithSizeAndOSWorldTasks",
			wrap(func(d desktop.Desktop) desktop.Desktop { return d }),
			Options{Width: width, Height: height, Blocking: fakeBlocking, Tasks: []desktop.Task{
				DefaultTask(),
				{ID: "feasible", Evaluator: []byte(`{"func": ["check_include_exclude", "compare_csv"], "conj": "and"}`)},
			}},
			nil,
		},
		{
			"WrongDeclaredSize",
			wrap(func(d desktop.Desktop) desktop.Desktop { return wrongSize{d} }),
			Options{Blocking: wrapBlocking(func(d desktop.Desktop) desktop.Desktop { return wrongSize{d} })},
			[]string{"Observe/AfterReset", "Act/EveryKind"},
		},
		{"Stepper", wrap(func(d desktop.Desktop) desktop.Desktop { return goodStepper{d} }), Options{}, nil},
		{"BadStepper", wrap(func(d desktop.Desktop) desktop.Desktop { return badStepper{d} }), Options{}, []string{"Step/LikeActThenWait"}},
		{"CodeOnlyStepper", wrap(func(d desktop.Desktop) desktop.Desktop { return codeOnlyStepper{d} }), Options{}, []string{"Step/LikeActThenWait"}},
		{
			"NotAPNG",
			wrap(func(d desktop.Desktop) desktop.Desktop { return notPNG{d} }),
			Options{},
			[]string{"Observe/AfterReset", "Act/EveryKind"},
		},
		{
			"SizeOtherThanDeclaredInOptions",
			wrap(func(d desktop.Desktop) desktop.Desktop { return d }),
			Options{Width: 1920, Height: 1080},
			[]string{"Observe/AfterReset", "Act/EveryKind"},
		},
		{
			"RewardTwo",
			wrap(func(d desktop.Desktop) desktop.Desktop { return fixedReward{d, 2} }),
			Options{},
			[]string{"Evaluate/Range", "Evaluate/Infeasible"},
		},
		{
			"InfeasibleIgnoresFail",
			wrap(func(d desktop.Desktop) desktop.Desktop { return fixedReward{d, 0} }),
			Options{},
			[]string{"Evaluate/Infeasible"},
		},
		{
			"HistoryOutlivesReset",
			wrap(func(d desktop.Desktop) desktop.Desktop { return &stickyFail{Desktop: d} }),
			Options{},
			[]string{"Evaluate/Infeasible"},
		},
		{
			"RejectsWait",
			wrap(func(d desktop.Desktop) desktop.Desktop { return rejectsWait{d} }),
			Options{},
			[]string{"Act/EveryKind"},
		},
		{
			"CloseNotIdempotent",
			wrap(func(d desktop.Desktop) desktop.Desktop { return &closeOnce{Desktop: d} }),
			Options{Blocking: fakeBlocking},
			[]string{"Close/Twice", "Close/Concurrent"},
		},
		{
			"NoErrClosedAfterClose",
			wrap(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, "", hidesErrClosed} }),
			Options{Blocking: wrapBlocking(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, "", hidesErrClosed} })},
			[]string{"Close/MethodsAfter"},
		},
		{
			"IgnoresCancel",
			wrap(func(d desktop.Desktop) desktop.Desktop { return newIgnoresCancel(d, false) }),
			Options{Bound: time.Second, Blocking: func(ctx context.Context, m Method) (desktop.Desktop, error) {
				if m == MethodWaitAfterReset {
					return newIgnoresCancel(newFake(), true), nil
				}
				return hangingFake(m), nil
			}},
			[]string{"Cancel/Before/WaitAfterReset", "Cancel/During/WaitAfterReset"},
		},
		{
			"CancelErrorDoesNotWrapCanceled",
			wrap(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, MethodEvaluate, evaluatorCrashed} }),
			Options{Blocking: wrapBlocking(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, MethodEvaluate, evaluatorCrashed} })},
			[]string{"Cancel/Before/Evaluate", "Cancel/During/Evaluate"},
		},
		{
			// nil is fine for a call that had nothing to wait for, not for
			// one that was blocked.
			"NilAfterCancel",
			wrap(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, MethodAct, succeedsAnyway} }),
			Options{Blocking: wrapBlocking(func(d desktop.Desktop) desktop.Desktop { return errMapper{d, MethodAct, succeedsAnyway} })},
			[]string{"Cancel/During/Act"},
		},
		{
			"CloseDoesNotInterrupt",
			wrap(func(d desktop.Desktop) desktop.Desktop { return d }),
			Options{Bound: time.Second, Blocking: func(ctx context.Context, m Method) (desktop.Desktop, error) {
				if m == MethodObserve {
					return deafToClose{newFake()}, nil
				}
				return hangingFake(m), nil
			}},
			[]string{"Close/During/Observe"},
		},
		{
			"BlockingDoesNotBlock",
			wrap(func(d desktop.Desktop) desktop.Desktop { return d }),
			// ctxBlind, since a plain fake's Observe looks at its ctx while
			// it waits for a screen to render on (fake.screens): a cancel
			// racing that select made Cancel/During/Observe pass or fail
			// by chance.
			Options{Blocking: func(context.Context, Method) (desktop.Desktop, error) { return ctxBlind{newFake()}, nil }},
			checksWith("Cancel/During/", "Close/During/"),
		},
		{
			"LeaksGoroutine",
			wrap(func(d desktop.Desktop) desktop.Desktop { return leaksOnWait{d, release, &leaked} }),
			Options{Blocking: fakeBlocking},
			[]string{"Act/EveryKind"},
		},
		{
			"NewDesktopFails",
			func(context.Context) (desktop.Desktop, error) { return nil, errors.New("no KVM") },
			Options{},
			CheckNames(),
		},
		{
			"BadOptions",
			wrap(func(d desktop.Desktop) desktop.Desktop { return d }),
			Options{Actions: []desktop.Action{desktop.DoneAction}},
			[]string{"Options"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fails := Check(t.Context(), tc.newDesktop, tc.opts)
			if diff := cmp.Diff(tc.want, failed(fails)); diff != "" {
				t.Errorf("failed checks (-want +got):\n%s", diff)
			}
			for _, f := range fails {
				t.Log(f)
			}
		})
	}
}

// evaluatorCrashed replaces a cancellation error with one that does not
// wrap it.
func evaluatorCrashed(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, desktop.ErrClosed) {
		return errors.New("evaluator crashed")
	}
	return err
}

// succeedsAnyway makes a call succeed once its ctx is cancelled.
func succeedsAnyway(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func TestRun(t *testing.T) {
	Run(t, func(*testing.T) desktop.Desktop { return newFake() }, Options{Width: width, Height: height, Blocking: fakeBlocking})
}

func TestCheckNamesUnique(t *testing.T) {
	names := CheckNames()
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("check %q twice", n)
		}
		seen[n] = true
	}
	if len(names) != 5+2*len(methods())+3+len(methods()) {
		t.Errorf("%d checks: %v", len(names), names)
	}
}
