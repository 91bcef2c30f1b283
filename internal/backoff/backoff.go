// Package backoff is how legato waits before trying again something that
// failed (a model server, a host, a download, a desktop): one doubling
// formula for every retry loop, and one sleep that gives up when its
// caller does.
package backoff

import (
	"context"
	"fmt"
	"time"
)

// Policy is an exponential backoff: the first wait is Base, each further
// one doubles it, and none exceeds Max.
type Policy struct {
	Base time.Duration
	Max  time.Duration
}

// Wait is the wait before retry n (from 0): min(Base·2ⁿ, Max). A negative
// n counts as 0. It never overflows, however large n is, so a caller can
// pass a failure count as it is rather than clamp it first.
func (p Policy) Wait(n int) time.Duration {
	n = max(n, 0)
	if p.Base <= 0 {
		return min(0, p.Max)
	}
	// Base ≤ Max>>n is Base<<n ≤ Max, tested without shifting Base, which
	// could overflow; a shift of 63 or more leaves nothing of any Max.
	if n >= 63 || p.Base > p.Max>>n {
		return p.Max
	}
	return p.Base << n
}

// Sleep waits for d, or until ctx is done and then returns an error that
// wraps ctx's error and its cause. Every wait of legato should be one, so
// that a call returns promptly when its caller gives up (as the desktop
// contract requires of a backend's waits). A d ≤ 0 returns at once: nil,
// unless ctx is already done.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return causeErr(ctx)
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return causeErr(ctx)
	}
}

// causeErr is ctx's error, with its cause when that says more.
func causeErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}
