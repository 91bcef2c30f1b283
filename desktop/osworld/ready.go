package osworld

import (
	"bytes"
	"context"
	"errors"
	"time"

	"legato/rl/desktop/osworld/guest"
)

// readySignal waits until the desktop is ready: Ready.Stable screenshots
// in a row are identical and, in each interval between them, the guest's
// CPUs were at most Ready.MaxLoad busy. It returns the time from its start
// to the first screenshot of that quiet run, or the time it waited when max
// passed first (which is not an error: the screen is then taken as it is).
//
// The load is measured in the guest, over the interval itself (one
// /execute that samples /proc/stat, sleeps, samples again), so each look
// costs one round trip for the load and one for the screenshot, and the
// screenshot's own work in the guest is not counted as load.
func (d *Desktop) readySignal(ctx context.Context, max time.Duration) (time.Duration, error) {
	d.readyShot = nil
	r := d.cfg.Ready
	start := time.Now()
	if max <= 0 {
		return 0, nil
	}
	deadline := start.Add(max)
	prev, err := d.guest.Screenshot(ctx)
	if err != nil {
		return time.Since(start), err
	}
	since, quiet := start, 0
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return time.Since(start), nil
		}
		interval := min(r.Interval, left)
		idle := true
		if !d.noLoad {
			load, err := d.sh.load(ctx, interval)
			switch {
			case errors.Is(err, errNoLoad):
				// A guest without /proc/stat: the screen alone decides.
				d.log.Warn("cannot measure the guest's load; the ready signal uses the screen only", "err", err)
				d.noLoad = true
			case err != nil:
				return time.Since(start), err
			default:
				idle = load <= r.MaxLoad
			}
		}
		if d.noLoad {
			if err := sleep(ctx, interval); err != nil {
				return time.Since(start), err
			}
		}
		if !time.Now().Before(deadline) {
			return time.Since(start), nil
		}
		at := time.Now()
		cur, err := d.guest.Screenshot(ctx)
		if err != nil {
			return time.Since(start), err
		}
		if idle && bytes.Equal(cur.PNG, prev.PNG) {
			quiet++
		} else {
			quiet, since = 0, at
		}
		prev = cur
		if quiet >= r.Stable-1 {
			d.readyShot = &readyShot{shot: cur, at: at}
			return since.Sub(start), nil
		}
	}
}

// readyShotFresh bounds the age of a ready signal's screenshot that
// Observe returns; the scheduler observes right after the wait.
const readyShotFresh = time.Second

// readyShot is the last screenshot of a ready signal that found the screen
// settled.
type readyShot struct {
	shot guest.Screenshot
	at   time.Time
}

// takeReadyShot returns the screenshot the ready signal just took, if the
// screen was found settled by it and no other call came since, and forgets
// it. The observation that follows a wait then costs no second screenshot
// of the same still screen (0.4-0.7 s under software emulation).
func (d *Desktop) takeReadyShot() (guest.Screenshot, time.Time, bool) {
	r := d.readyShot
	d.readyShot = nil
	if r == nil || time.Since(r.at) > readyShotFresh {
		return guest.Screenshot{}, time.Time{}, false
	}
	return r.shot, r.at, true
}
