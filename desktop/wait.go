package desktop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"legato/rl/internal/backoff"
)

// ReadyWaiter is implemented by desktops that know when their screen is
// ready after an action better than the generic signal built on Observe
// (for example by also checking that the guest is idle, or by watching the
// framebuffer inside the guest).
//
// WaitReady returns at the latest after max, without an error when max
// passed: the screen is then taken as it is. The observation it returns is
// the screen the wait ended on; the caller uses it as the next observation,
// so a desktop never needs to keep a screenshot for a later Observe.
type ReadyWaiter interface {
	WaitReady(ctx context.Context, max time.Duration) (Ready, error)
}

// Ready is how a wait for the screen ended.
type Ready struct {
	// Observation is the screen when the wait ended. Its At is when the
	// screenshot was requested.
	Observation Observation
	// After is the time from the start of the wait until the screen was
	// found ready (the first of the screenshots that showed it settled, or
	// the backend's own signal), or the whole wait when max passed first.
	// Zero when the wait does not know (a fixed sleep).
	After time.Duration
	// Settled is false when max passed before the screen settled, or when
	// nothing looked (a fixed sleep).
	Settled bool
	// Capture and Encode are how long the screenshot's capture and its
	// encoding as PNG took where it was taken, when the desktop knows
	// (a screenshot taken in the guest with the wait); zero otherwise.
	Capture, Encode time.Duration
	// ShotInWait says the screenshot was taken while the wait ran (the
	// screen was quiet, and stayed so until it counted as settled): its
	// capture and encoding are part of After, not after it.
	ShotInWait bool
}

// Stepper is implemented by desktops that run an action, wait until the
// screen is ready and take the screenshot to continue from in one go (one
// round trip to the guest instead of three). Step does what Act followed
// by WaitReady(max) does, in one call; for a terminal action (DONE, FAIL)
// it only acts, and the returned Ready is empty.
type Stepper interface {
	Step(ctx context.Context, a Action, max time.Duration) (StepResult, error)
}

// StepResult is what a Step did.
type StepResult struct {
	Act   ActResult
	Ready Ready
	// ActTime is how long the action ran; WaitTime the time from its end
	// until the screenshot of Ready was taken. Where the desktop measured
	// them in the guest, the rest of the step's time is the round trip.
	ActTime, WaitTime time.Duration
}

// Defaults of ReadyOptions.
const (
	DefaultReadyInterval = 300 * time.Millisecond
	DefaultReadyMax      = 10 * time.Second
	DefaultReadyStable   = 2
)

// ReadyOptions configures WaitReady's generic signal.
type ReadyOptions struct {
	// Interval is the time between two looks at the screen (default
	// 300 ms).
	Interval time.Duration
	// Max bounds the wait (default 10 s); it is also what a ReadyWaiter is
	// given.
	Max time.Duration
	// Stable is the number of identical screenshots in a row that mean the
	// screen is ready (default 2).
	Stable int
}

// WithDefaults fills the zero fields with the defaults.
func (o ReadyOptions) WithDefaults() ReadyOptions {
	if o.Interval == 0 {
		o.Interval = DefaultReadyInterval
	}
	if o.Max == 0 {
		o.Max = DefaultReadyMax
	}
	if o.Stable == 0 {
		o.Stable = DefaultReadyStable
	}
	return o
}

// Validate reports options that cannot work.
func (o ReadyOptions) Validate() error {
	var errs []error
	if o.Interval < 0 {
		errs = append(errs, fmt.Errorf("ready interval %v: want > 0", o.Interval))
	}
	if o.Max < 0 {
		errs = append(errs, fmt.Errorf("ready max %v: want > 0", o.Max))
	}
	if o.Stable < 0 || o.Stable == 1 {
		errs = append(errs, fmt.Errorf("ready stable %d: want ≥ 2 identical screenshots", o.Stable))
	}
	return errors.Join(errs...)
}

// WaitReady waits after an action until d's screen is ready and returns the
// observation to continue from. A desktop that implements ReadyWaiter
// decides itself; for any other, the screen is ready once o.Stable
// consecutive screenshots, o.Interval apart, are byte-identical, or o.Max
// has passed.
func WaitReady(ctx context.Context, d Desktop, o ReadyOptions) (Ready, error) {
	o = o.WithDefaults()
	if rw, ok := d.(ReadyWaiter); ok {
		return rw.WaitReady(ctx, o.Max)
	}
	start := time.Now()
	prev, err := d.Observe(ctx)
	if err != nil {
		return Ready{}, fmt.Errorf("observe: %w", err)
	}
	stableSince, same := prev.At, 1
	deadline := start.Add(o.Max)
	for same < o.Stable && time.Now().Before(deadline) {
		if err := backoff.Sleep(ctx, min(o.Interval, time.Until(deadline))); err != nil {
			return Ready{Observation: prev}, err
		}
		cur, err := d.Observe(ctx)
		if err != nil {
			return Ready{Observation: prev}, fmt.Errorf("observe: %w", err)
		}
		if bytes.Equal(cur.Screenshot, prev.Screenshot) {
			same++
		} else {
			same, stableSince = 1, cur.At
		}
		prev = cur
	}
	if same >= o.Stable {
		return Ready{Observation: prev, After: stableSince.Sub(start), Settled: true}, nil
	}
	return Ready{Observation: prev, After: time.Since(start)}, nil
}

// FixedWaits replaces every wait of a desktop by a fixed sleep, as
// OSWorld's own runner did, for baselines that measure what the ready
// signal saves. Each wait is exactly its field, zero included: nothing
// else is added. OSWorld's runner slept 60 s after a reset, 20 s before
// grading and a few seconds after each action.
type FixedWaits struct {
	AfterReset  time.Duration
	AfterAction time.Duration
	BeforeEval  time.Duration
}

// Validate reports negative waits.
func (w FixedWaits) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"fixed wait after reset", w.AfterReset}, {"fixed wait after an action", w.AfterAction}, {"fixed wait before eval", w.BeforeEval}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want ≥ 0", f.name, f.d))
		}
	}
	return errors.Join(errs...)
}

// WithFixedWaits returns a factory whose desktops are f's with their waits
// replaced by w's sleeps. It works with every backend.
func WithFixedWaits(f Factory, w FixedWaits) Factory {
	return func(ctx context.Context, slot int) (Desktop, error) {
		d, err := f(ctx, slot)
		if err != nil || d == nil {
			return d, err
		}
		return &fixedWaitDesktop{Desktop: d, w: w}, nil
	}
}

type fixedWaitDesktop struct {
	Desktop
	w FixedWaits
}

func (d *fixedWaitDesktop) WaitAfterReset(ctx context.Context) error {
	return backoff.Sleep(ctx, d.w.AfterReset)
}

func (d *fixedWaitDesktop) WaitBeforeEval(ctx context.Context) error {
	return backoff.Sleep(ctx, d.w.BeforeEval)
}

// WaitReady sleeps the fixed wait, whatever max says (the baseline is the
// fixed wait), then looks once.
func (d *fixedWaitDesktop) WaitReady(ctx context.Context, _ time.Duration) (Ready, error) {
	if err := backoff.Sleep(ctx, d.w.AfterAction); err != nil {
		return Ready{}, err
	}
	obs, err := d.Observe(ctx)
	if err != nil {
		return Ready{}, fmt.Errorf("observe: %w", err)
	}
	return Ready{Observation: obs}, nil
}

// AttemptReport passes on what the desktop whose waits were replaced says
// of the attempt.
func (d *fixedWaitDesktop) AttemptReport() AttemptReport {
	if r, ok := d.Desktop.(Reporter); ok {
		return r.AttemptReport()
	}
	return AttemptReport{}
}

// ExplainGrade passes on what the desktop whose waits were replaced says
// of its last grade.
func (d *fixedWaitDesktop) ExplainGrade() string {
	if e, ok := d.Desktop.(GradeExplainer); ok {
		return e.ExplainGrade()
	}
	return ""
}

// Retiring passes on whether the desktop whose waits were replaced asks
// to be replaced.
func (d *fixedWaitDesktop) Retiring() bool {
	r, ok := d.Desktop.(Retirer)
	return ok && r.Retiring()
}

// Affinity passes on where the desktop whose waits were replaced starts
// a task's attempts fastest.
func (d *fixedWaitDesktop) Affinity(taskID string) Affinity {
	if p, ok := d.Desktop.(Placer); ok {
		return p.Affinity(taskID)
	}
	return AnyDesktop
}

// The grading capabilities pass on to the desktop whose waits were
// replaced; one it lacks is ErrUnsupported.

func (d *fixedWaitDesktop) EvaluateAgain(ctx context.Context, task Task) (float64, error) {
	r, err := inner[Regrader](d, "grade an end state again")
	if err != nil {
		return 0, err
	}
	return r.EvaluateAgain(ctx, task)
}

func (d *fixedWaitDesktop) KeepEndState(ctx context.Context, name string) (EndState, error) {
	k, err := inner[EndStateKeeper](d, "keep end states")
	if err != nil {
		return EndState{}, err
	}
	return k.KeepEndState(ctx, name)
}

func (d *fixedWaitDesktop) DropEndState(ctx context.Context, ref string) error {
	k, err := inner[EndStateKeeper](d, "keep end states")
	if err != nil {
		return err
	}
	return k.DropEndState(ctx, ref)
}

func (d *fixedWaitDesktop) GradeEndState(ctx context.Context, ref string, task Task, last Action) (float64, error) {
	g, err := inner[EndStateGrader](d, "grade kept end states")
	if err != nil {
		return 0, err
	}
	return g.GradeEndState(ctx, ref, task, last)
}

// inner returns the wrapped desktop as a T, or ErrUnsupported saying it
// cannot do what.
func inner[T any](d *fixedWaitDesktop, what string) (T, error) {
	t, ok := d.Desktop.(T)
	if !ok {
		return t, fmt.Errorf("%w: the desktop cannot %s", ErrUnsupported, what)
	}
	return t, nil
}

// Unwrap returns the desktop whose waits were replaced, for tests and for
// callers that need the backend's own type.
func (d *fixedWaitDesktop) Unwrap() Desktop { return d.Desktop }
