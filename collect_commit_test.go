package rl

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
)

// resetCounter counts the Resets of the desktops it wraps and closes
// second at the second.
type resetCounter struct {
	desktop.Desktop
	n      *atomic.Int32
	second chan struct{}
}

func (d resetCounter) Reset(ctx context.Context, task desktop.Task) error {
	if d.n.Add(1) == 2 {
		close(d.second)
	}
	return d.Desktop.Reset(ctx, task)
}

// TestDesktopDoesNotWaitForCommit: a desktop takes its next attempt while
// its last record is still committing. The first record's commit is held
// until the one desktop resets for the second attempt (or an hour of the
// bubble's clock passes, which it does at once if the desktop waits for
// that commit).
// Both records still land, and the batch ends only after they do.
func TestDesktopDoesNotWaitForCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{Script: clicksThenDone(1)}, fake.Config{})
		e.opts.Desktops, e.opts.Group = 1, 1
		var resets atomic.Int32
		second := make(chan struct{})
		newDesktop := e.opts.NewDesktop
		e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := newDesktop(ctx, slot)
			return resetCounter{d, &resets, second}, err
		}
		var mu sync.Mutex
		var waits []time.Duration
		e.opts.OnCommitted = func(d time.Duration) {
			mu.Lock()
			first := len(waits) == 0
			waits = append(waits, d)
			mu.Unlock()
			if first {
				// An hour on the bubble's clock passes at once when
				// nothing else can run: the desktop waited on us.
				select {
				case <-second:
				case <-time.After(time.Hour):
					t.Error("the desktop did not take its next attempt while its record committed")
				}
			}
		}
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := sum.GroupsClosed; got != 2 {
			t.Errorf("%d groups closed, want 2", got)
		}
		if recs := readRecords(t, e.opts.Out); len(recs) != 2 {
			t.Errorf("%d records, want 2", len(recs))
		}
		mu.Lock()
		defer mu.Unlock()
		if len(waits) != 2 {
			t.Errorf("%d commits reported, want 2", len(waits))
		}
	})
}
