package backoff

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWait(t *testing.T) {
	const forever = time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		name string
		p    Policy
		n    int
		want time.Duration
	}{
		{"first", Policy{Base: 250 * time.Millisecond, Max: 2 * time.Second}, 0, 250 * time.Millisecond},
		{"doubled", Policy{Base: 250 * time.Millisecond, Max: 2 * time.Second}, 2, time.Second},
		{"reaches the cap", Policy{Base: 250 * time.Millisecond, Max: 2 * time.Second}, 3, 2 * time.Second},
		{"past the cap", Policy{Base: 250 * time.Millisecond, Max: 2 * time.Second}, 4, 2 * time.Second},
		{"cap not a power of two", Policy{Base: time.Second, Max: 3 * time.Second}, 2, 3 * time.Second},
		{"negative n", Policy{Base: time.Second, Max: time.Minute}, -5, time.Second},
		{"huge n", Policy{Base: time.Second, Max: time.Minute}, math.MaxInt, time.Minute},
		{"n of the width of int64", Policy{Base: 1, Max: forever}, 63, forever},
		{"largest shift that fits", Policy{Base: 1, Max: forever}, 62, 1 << 62},
		{"would overflow", Policy{Base: time.Hour, Max: forever}, 40, forever},
		{"cap below base", Policy{Base: time.Second, Max: time.Millisecond}, 0, time.Millisecond},
		{"no base", Policy{Max: time.Second}, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Wait(tc.n); got != tc.want {
				t.Errorf("%+v.Wait(%d) = %v, want %v", tc.p, tc.n, got, tc.want)
			}
		})
	}
}

func TestSleep(t *testing.T) {
	cause := errors.New("batch stopped")
	t.Run("waits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			if err := Sleep(t.Context(), time.Minute); err != nil || time.Since(start) != time.Minute {
				t.Errorf("Sleep(1m) = %v after %v; want nil after 1m", err, time.Since(start))
			}
		})
	})
	t.Run("cancelled before", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		cancel(cause)
		for _, d := range []time.Duration{time.Hour, 0} {
			if err := Sleep(ctx, d); !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
				t.Errorf("Sleep(%v) on a done ctx = %v; want it to wrap context.Canceled and the cause", d, err)
			}
		}
	})
	t.Run("cancelled during", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			time.AfterFunc(time.Second, func() { cancel(cause) })
			start := time.Now()
			err := Sleep(ctx, time.Hour)
			if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
				t.Errorf("Sleep = %v; want it to wrap context.Canceled and the cause", err)
			}
			if took := time.Since(start); took != time.Second {
				t.Errorf("Sleep returned after %v, want 1s (when ctx was cancelled)", took)
			}
		})
	})
	t.Run("deadline without a cause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if err := Sleep(ctx, time.Hour); err != context.DeadlineExceeded {
				t.Errorf("Sleep past the deadline = %v, want context.DeadlineExceeded itself", err)
			}
		})
	})
	t.Run("zero duration", func(t *testing.T) {
		if err := Sleep(t.Context(), 0); err != nil {
			t.Errorf("Sleep(0) = %v", err)
		}
		if err := Sleep(t.Context(), -time.Second); err != nil {
			t.Errorf("Sleep(-1s) = %v", err)
		}
	})
}
