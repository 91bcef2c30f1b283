package rl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// Defaults of ReadyOptions.
const (
	DefaultReadyInterval = 300 * time.Millisecond
	DefaultReadyMax      = 10 * time.Second
	DefaultReadyStable   = 2
)

// The fixed sleeps of OSWorld's own runner, for baselines that reproduce
// it: ReadyOptions{Disabled: true, FixedWait: S, AfterReset:
// OSWorldAfterReset, BeforeEval: OSWorldBeforeEval}.
const (
	OSWorldAfterReset = 60 * time.Second
	OSWorldBeforeEval = 20 * time.Second
)

// ReadyOptions configures the wait after each action: by default the ready
// signal, which looks at the screen until it stops changing; with Disabled,
// a fixed sleep as OSWorld's own runner did (for baselines).
type ReadyOptions struct {
	// Disabled turns the ready signal off; every action is followed by
	// FixedWait.
	Disabled  bool
	FixedWait time.Duration
	// AfterReset and BeforeEval, when set (with Disabled), replace the
	// desktop's own WaitAfterReset and WaitBeforeEval by fixed sleeps, as
	// OSWorld's runner did (OSWorldAfterReset, OSWorldBeforeEval). Zero
	// keeps the desktop's waits.
	AfterReset time.Duration
	BeforeEval time.Duration
	// Interval is the time between two looks at the screen (default 300 ms).
	Interval time.Duration
	// Max bounds the wait; the screen is taken as it is after Max (default
	// 10 s).
	Max time.Duration
	// Stable is the number of consecutive identical screenshots that mean
	// the screen is ready (default 2).
	Stable int
}

func (o ReadyOptions) withDefaults() ReadyOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultReadyInterval
	}
	if o.Max <= 0 {
		o.Max = DefaultReadyMax
	}
	if o.Stable <= 1 {
		o.Stable = DefaultReadyStable
	}
	return o
}

// Validate reports whether the options make sense.
func (o ReadyOptions) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"fixed wait", o.FixedWait}, {"fixed wait after reset", o.AfterReset}, {"fixed wait before eval", o.BeforeEval}} {
		switch {
		case f.d < 0:
			errs = append(errs, fmt.Errorf("%s %v: want ≥ 0", f.name, f.d))
		case f.d > 0 && !o.Disabled:
			errs = append(errs, fmt.Errorf("%s %v: fixed waits apply only with the ready signal off (ReadyOptions.Disabled, --no-ready-signal)", f.name, f.d))
		}
	}
	return errors.Join(errs...)
}

// waitReady waits after an action until the screen is ready and returns the
// observation to continue from. It fills ar's wait_s (from the end of the
// action to the start of the last screenshot), ready_s (from the end of the
// action until the screen was found ready: the first of the identical
// screenshots, or the backend's own signal) and obs_s (the last
// screenshot), so that the three never overlap.
func (b *batch) waitReady(ctx context.Context, d desktop.Desktop, ar *schema.ActionRecord) (desktop.Observation, error) {
	o := b.opts.Ready
	start := time.Now()
	r, err := desktop.WaitReady(ctx, d, desktop.ReadyOptions{Interval: o.Interval, Max: o.Max, Stable: o.Stable})
	end := time.Now()
	if err != nil {
		ar.WaitS = end.Sub(start).Seconds()
		return desktop.Observation{}, fmt.Errorf("wait ready: %w", err)
	}
	at := r.Observation.At
	if at.IsZero() || at.Before(start) || at.After(end) {
		at = end
	}
	ar.ReadyS = r.After.Seconds()
	ar.WaitS = at.Sub(start).Seconds()
	ar.ObsS = end.Sub(at).Seconds()
	return r.Observation, nil
}
