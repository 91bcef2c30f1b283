package osworld

import (
	"bytes"
	"context"
	"errors"
	"time"

	"legato/rl/desktop"
	"legato/rl/internal/backoff"
)

// minProbe is the shortest quiet probe worth a round trip.
const minProbe = 50 * time.Millisecond

// waitCosts are a desktop's running estimates of what the ready signal's
// calls cost, so that a wait can plan its last screenshot to end by its
// bound.
type waitCosts struct {
	// shot is a screenshot's round trip.
	shot time.Duration
	// probe is a quiet probe's round trip beyond the interval it watches.
	probe time.Duration
	// settle is a settle request's round trip beyond the executor's wait;
	// settleShot that of one that brings the screenshot (its capture,
	// encoding and transfer).
	settle, settleShot time.Duration
}

func ewma(old, d time.Duration) time.Duration {
	if old == 0 {
		return d
	}
	return time.Duration(0.3*float64(d) + 0.7*float64(old))
}

// waitFor says what a ready wait is for.
type waitFor struct {
	// shot: the caller needs the screen the wait ended on. Without it the
	// wait takes no screenshot it can do without.
	shot bool
	// quiet is the least quiet interval that counts as settled, beyond
	// the configured ones (a golden state is taken on a longer quiet).
	quiet time.Duration
	// window is the executor's settle window ("" for its default; see
	// guestpy/executor.py).
	window string
}

// executorInterval is the quiet interval of a settle the executor watches.
func (d *Desktop) executorInterval(w waitFor) time.Duration {
	return max(d.cfg.Ready.ExecutorInterval, w.quiet)
}

// quietInterval is the quiet interval of the probes and screenshots.
func (d *Desktop) quietInterval(w waitFor) time.Duration {
	return max(d.cfg.Ready.Interval, w.quiet)
}

// readySignal waits until the desktop is ready and returns the screen it
// ended on (with w.shot), at most max after it started (its last
// screenshot is planned to end by then, and every call before it is cut
// off there).
//
// Where the guest can watch its own screen (the X DAMAGE extension, through
// the quiet probe), the desktop is ready once, over one Ready.Interval, the
// guest's CPUs were at most Ready.MaxLoad busy and at most Ready.MaxDamage
// pixels were redrawn; one screenshot then shows the settled screen.
// Elsewhere (or with Ready.NoDamage) Ready.Stable screenshots in a row must
// be identical, with the guest idle in between; no screenshot is taken
// while the guest is busy. When max passes first the screen is taken as it
// is (not an error), from the last screenshot if nothing happened after it.
func (d *Desktop) readySignal(ctx context.Context, max time.Duration, w waitFor) (desktop.Ready, error) {
	start := time.Now()
	deadline := start.Add(max)
	if !d.cfg.Ready.NoDamage && !d.noDamage {
		if r, err, done := d.waitExecutor(ctx, start, deadline, w); done {
			return r, err
		}
		r, err, done := d.waitDamage(ctx, start, deadline, w)
		if done {
			return r, err
		}
	}
	return d.waitScreens(ctx, start, deadline, w)
}

// waitDamage is the ready signal with the guest watching its screen. It
// reports done=false when the guest cannot watch it; the caller then
// compares screenshots for the rest of the wait.
func (d *Desktop) waitDamage(ctx context.Context, start, deadline time.Time, w waitFor) (r desktop.Ready, err error, done bool) {
	cfg := d.cfg.Ready
	lastShot := d.waits.shot
	if !w.shot {
		lastShot = 0
	}
	for {
		interval := d.quietInterval(w)
		if interval < minProbe || time.Until(deadline)-lastShot-d.waits.probe < interval {
			// A shorter look cannot tell that the screen stayed still for
			// an interval (a blinking caret's phase fits in it).
			break
		}
		t0 := time.Now()
		p, err := d.watch(ctx, deadline, interval, true)
		if errors.Is(err, errPastDeadline) {
			break
		}
		if err != nil {
			return desktop.Ready{}, err, true
		}
		if p.Damage == nil {
			d.log.Warn("the guest cannot watch its screen; the ready signal compares screenshots instead", "why", p.Why)
			d.noDamage = true
			return desktop.Ready{}, nil, false
		}
		if p.Load <= cfg.MaxLoad && *p.Damage <= cfg.MaxDamage {
			r := desktop.Ready{After: t0.Sub(start), Settled: true}
			if w.shot {
				r.Observation, err = d.timedShot(ctx)
			}
			return r, err, true
		}
	}
	r = desktop.Ready{After: time.Since(start)}
	if w.shot {
		r.Observation, err = d.timedShot(ctx)
	}
	return r, err, true
}

// waitScreens is the ready signal that compares screenshots.
func (d *Desktop) waitScreens(ctx context.Context, start, deadline time.Time, w waitFor) (desktop.Ready, error) {
	cfg := d.cfg.Ready
	prev, err := d.timedShot(ctx)
	if err != nil {
		return desktop.Ready{}, err
	}
	since, same := prev.At, 1
	// clean: nothing happened since prev was taken.
	clean := true
	for same < cfg.Stable {
		interval := d.probeInterval(deadline, w)
		if interval < minProbe {
			break
		}
		p, err := d.watch(ctx, deadline, interval, false)
		if errors.Is(err, errPastDeadline) {
			break
		}
		if err != nil {
			return desktop.Ready{Observation: prev}, err
		}
		idle := p.Load <= cfg.MaxLoad
		if !idle {
			// Screenshots cost the guest work too: none while it is busy.
			clean = false
			same = 0
			continue
		}
		if time.Until(deadline) < d.waits.shot {
			break
		}
		cur, err := d.timedShot(ctx)
		if err != nil {
			return desktop.Ready{Observation: prev}, err
		}
		if clean && bytes.Equal(cur.Screenshot, prev.Screenshot) {
			same++
		} else {
			same, since = 1, cur.At
		}
		prev, clean = cur, true
	}
	if same >= cfg.Stable {
		return desktop.Ready{Observation: prev, After: since.Sub(start), Settled: true}, nil
	}
	if !clean {
		// Something happened after the last screenshot: one more, planned
		// to end by the bound.
		if prev, err = d.timedShot(ctx); err != nil {
			return desktop.Ready{}, err
		}
	}
	return desktop.Ready{Observation: prev, After: time.Since(start)}, nil
}

// probeInterval is how long the next quiet probe may watch so that it and
// the last screenshot after it end by deadline.
func (d *Desktop) probeInterval(deadline time.Time, w waitFor) time.Duration {
	return min(d.quietInterval(w), time.Until(deadline)-d.waits.shot-d.waits.probe)
}

// errPastDeadline means a call of the wait was cut off at its bound.
var errPastDeadline = errors.New("ready wait bound reached")

// watch watches the guest for interval with a call that ends in time for
// the last screenshot to end by deadline. Without damage it measures the
// load only (a shell, cheaper than Python).
func (d *Desktop) watch(ctx context.Context, deadline time.Time, interval time.Duration, damage bool) (quietProbe, error) {
	pctx, cancel := context.WithDeadline(ctx, deadline.Add(-d.waits.shot))
	defer cancel()
	t0 := time.Now()
	var (
		p   quietProbe
		err error
	)
	switch {
	case damage:
		p, err = d.sh.quiet(pctx, interval)
		if errors.Is(err, errNoPython) {
			p, err = quietProbe{Why: err.Error()}, nil
		}
	case d.noLoad:
		err = backoff.Sleep(pctx, interval)
	default:
		p.Load, err = d.sh.load(pctx, interval)
		if errors.Is(err, errNoLoad) {
			// A guest without /proc/stat: the screen alone decides.
			d.log.Warn("cannot measure the guest's load; the ready signal uses the screen only", "err", err)
			d.noLoad, p.Load, err = true, 0, nil
		}
	}
	if err != nil && ctx.Err() == nil && pctx.Err() != nil {
		return p, errPastDeadline
	}
	if err == nil {
		d.waits.probe = ewma(d.waits.probe, max(0, time.Since(t0)-interval))
	}
	return p, err
}

// timedShot takes a screenshot and learns what one costs.
func (d *Desktop) timedShot(ctx context.Context) (desktop.Observation, error) {
	t0 := time.Now()
	obs, err := d.screenshot(ctx)
	if err == nil {
		d.waits.shot = ewma(d.waits.shot, time.Since(t0))
	}
	return obs, err
}
