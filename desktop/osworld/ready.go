package osworld

import (
	"bytes"
	"context"
	"errors"
	"time"

	"legato/rl/desktop"
)

// readySignal waits until the desktop is ready: Ready.Stable screenshots
// in a row are identical and, in each interval between them, the guest's
// CPUs were at most Ready.MaxLoad busy. It returns the last screenshot and
// the time from its start to the first screenshot of that quiet run, or the
// whole wait when max passed first (which is not an error: the screen is
// then taken as it is).
//
// The load is measured in the guest, over the interval itself (one
// /execute that samples /proc/stat, sleeps, samples again), so each look
// costs one round trip for the load and one for the screenshot, and the
// screenshot's own work in the guest is not counted as load.
func (d *Desktop) readySignal(ctx context.Context, max time.Duration) (desktop.Ready, error) {
	r := d.cfg.Ready
	start := time.Now()
	deadline := start.Add(max)
	prev, err := d.screenshot(ctx)
	if err != nil {
		return desktop.Ready{}, err
	}
	since, quiet := start, 0
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return desktop.Ready{Observation: prev, After: time.Since(start)}, nil
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
				return desktop.Ready{Observation: prev}, err
			default:
				idle = load <= r.MaxLoad
			}
		}
		if d.noLoad {
			if err := desktop.Sleep(ctx, interval); err != nil {
				return desktop.Ready{Observation: prev}, err
			}
		}
		if !time.Now().Before(deadline) {
			return desktop.Ready{Observation: prev, After: time.Since(start)}, nil
		}
		cur, err := d.screenshot(ctx)
		if err != nil {
			return desktop.Ready{Observation: prev}, err
		}
		if idle && bytes.Equal(cur.Screenshot, prev.Screenshot) {
			quiet++
		} else {
			quiet, since = 0, cur.At
		}
		prev = cur
		if quiet >= r.Stable-1 {
			return desktop.Ready{Observation: cur, After: since.Sub(start), Settled: true}, nil
		}
	}
}
