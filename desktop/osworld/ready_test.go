package osworld

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    float64
		wantErr bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{name: "half busy", out: "cpu 100 0 100 400 0 0 0 0 0 0\ncpu 150 0 150 500 0 0 0 0 0 0\n", want: 0.5},
		{name: "idle", out: "cpu 100 0 100 400 0 0 0 0\ncpu 100 0 100 600 0 0 0 0\n", want: 0},
		{name: "iowait is idle", out: "cpu 0 0 0 0 0 0 0 0\ncpu 0 0 0 50 50 0 0 0\n", want: 0},
		{name: "steal and irq are busy", out: "cpu 0 0 0 0 0 0 0 0\ncpu 0 0 0 50 0 10 10 30\n", want: 0.5},
		{name: "guest time counted once", out: "cpu 0 0 0 0 0 0 0 0 0 0\ncpu 50 0 0 50 0 0 0 0 50 0\n", want: 0.5},
		{name: "no tick passed", out: "cpu 1 2 3 4\ncpu 1 2 3 4\n", want: 0},
		{name: "old kernel, four fields", out: "cpu 0 0 0 0\ncpu 30 0 0 70\n", want: 0.3},
		{name: "one line", out: "cpu 1 2 3 4 5\n", wantErr: true},
		{name: "not cpu", out: "intr 1 2 3 4\ncpu 1 2 3 4\n", wantErr: true},
		{name: "not a number", out: "cpu 1 x 3 4\ncpu 1 2 3 4\n", wantErr: true},
		{name: "empty", out: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseLoad(tt.out)
			if tt.wantErr {
				if !errors.Is(err, errNoLoad) {
					t.Errorf("parseLoad = %v, %v; want an error wrapping errNoLoad", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("load (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadySignal runs the ready signal against the host guest: a still
// screen is found ready before the bound, a screen that keeps changing
// never is, and the load is measured in the guest.
func TestReadySignal(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()

	load, err := d.sh.load(ctx, 100*time.Millisecond)
	if err != nil || load < 0 || load > 1 {
		t.Errorf("guest load = %v, %v; want a share in [0, 1]", load, err)
	}

	// The bound is far beyond what a still screen needs: reaching it
	// would mean the signal never saw the screen settle.
	const long = 2 * time.Minute
	r, err := d.WaitReady(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if r.After >= long || !r.Settled {
		t.Errorf("still screen: WaitReady ready after %v, settled %v; want settled before its bound (%v)", r.After, r.Settled, long)
	}

	// A clock printing every 20 ms: the screen never settles. The ready
	// signal looks for any quiet Interval: a terminal on a saturated host
	// pauses for 100 ms now and then (0.24 s measured), not for the
	// default 500 ms.
	if err := d.Reset(ctx, clockTask(t, g, "0.02")); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-clock")
	waitChanging(t, d)
	d.cfg.Ready.Interval = DefaultGuestReadyInterval
	const short = 1500 * time.Millisecond
	// The wait ends by its bound, planning its last screenshot to: it
	// looked for most of it. On a saturated machine the clock itself can
	// stall for a quiet interval, which the signal rightly takes for a
	// settled screen: such a wait is tried again, at most three times.
	var ends []string
	for range 3 {
		r, err = d.WaitReady(ctx, short)
		if err != nil {
			t.Fatal(err)
		}
		if r.After >= short/2 && !r.Settled {
			return
		}
		ends = append(ends, fmt.Sprintf("after %v, settled %v", r.After, r.Settled))
	}
	t.Errorf("changing screen: WaitReady returned %q; want unsettled near its bound %v", ends, short)
}

// waitChanging returns once the screen changes: a program whose window
// is there may not draw yet.
func waitChanging(t *testing.T, d *Desktop) {
	t.Helper()
	first, err := d.Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		cur, err := d.Observe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cur.Screenshot, first.Screenshot) {
			return
		}
	}
	t.Fatal("the screen did not change in 30 s")
}

// TestWaitReadyHandsOverItsScreenshot: a wait that found the screen
// settled returns its last screenshot, so the step that follows needs no
// second one; Observe always takes a new one. Where the guest watches its
// screen a settled wait takes one screenshot; comparing screenshots takes
// Stable.
func TestWaitReadyHandsOverItsScreenshot(t *testing.T) {
	g := startHostGuest(t)
	var shots atomic.Int64
	proxy := newHangProxy(t, g.URL, func(path string, _ []byte) bool {
		if path == "/screenshot" {
			shots.Add(1)
		}
		return false
	})
	for _, noDamage := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoDamage=%v", noDamage), func(t *testing.T) {
			cfg := g.config(t, proxy.srv.URL)
			cfg.Ready.NoDamage = noDamage
			d := g.desktop(t, cfg)
			ctx := t.Context()
			want := int64(1)
			if noDamage {
				want = int64(d.cfg.Ready.Stable)
			}
			for i := range 3 {
				before := shots.Load()
				r, err := d.WaitReady(ctx, time.Minute)
				if err != nil || !r.Settled {
					t.Fatalf("WaitReady: settled %v, %v", r.Settled, err)
				}
				if n := shots.Load() - before; n != want {
					t.Errorf("wait %d: a settled wait took %d screenshots, want %d", i, n, want)
				}
				if d.noDamage {
					t.Errorf("the host guest cannot watch its screen")
				}
				obs, err := d.Observe(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(obs.Screenshot, r.Observation.Screenshot) || r.Observation.At.IsZero() {
					t.Errorf("WaitReady's observation (%d bytes at %v) is not the still screen (%d bytes)", len(r.Observation.Screenshot), r.Observation.At, len(obs.Screenshot))
				}
				if !r.Observation.At.Before(obs.At) {
					t.Errorf("WaitReady's screenshot at %v, not before the later Observe at %v", r.Observation.At, obs.At)
				}
			}
		})
	}
}

// TestWaitReadyHonoursItsBound: with screenshots that take a second and a
// screen that never settles, a wait plans its last screenshot to end by its
// bound, and cuts off what would run past it. Before it did, a probe and a
// screenshot started just before the bound ran a few seconds past it. The
// margin is one screenshot: the estimate of its cost may lag the truth.
//
// What is bounded is the time the wait's calls spend in the guest, as the
// proxy in front of it measures: that is what the plan decides. The wall
// time of the wait also holds the host's own delays, which on a loaded
// machine (a CI runner at -race) reached a second; it is logged, not
// asserted. A settle that hangs in the guest shows the cut-off: the wait
// still returns the screen, its guest time within the same bound.
func TestWaitReadyHonoursItsBound(t *testing.T) {
	g := startHostGuest(t)
	const shot = time.Second
	var hangSettle atomic.Bool
	proxy := newHangProxy(t, g.URL, func(path string, body []byte) bool {
		if path == "/screenshot" {
			time.Sleep(shot)
		}
		return hangSettle.Load() && path == "/execute" && bytes.Contains(body, []byte(`\"op\":\"settle\"`))
	})
	for _, noDamage := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoDamage=%v", noDamage), func(t *testing.T) {
			cfg := g.config(t, proxy.srv.URL)
			cfg.Ready.NoDamage = noDamage
			cfg.Ready.Interval = 700 * time.Millisecond
			d := g.desktop(t, cfg)
			ctx := t.Context()
			if err := d.Reset(ctx, clockTask(t, g, "0.05")); err != nil {
				t.Fatal(err)
			}
			g.WaitWindow(t, "legato-clock")
			wait := func(max time.Duration) {
				t.Helper()
				proxy.takeCalls()
				t0 := time.Now()
				deadline := t0.Add(max)
				r, err := d.WaitReady(ctx, max)
				took, calls := time.Since(t0), proxy.takeCalls()
				if err != nil {
					t.Fatal(err)
				}
				if r.Settled || len(r.Observation.Screenshot) == 0 {
					t.Errorf("max %v: settled %v with %d bytes; want the unsettled screen as it is", max, r.Settled, len(r.Observation.Screenshot))
				}
				t.Logf("max %v: took %v in %d guest calls", max, took, len(calls))
				// What the wait decides, not how long the guest took (a
				// loaded machine slows every call, the screenshot it ends
				// with most): it begins no call after its deadline but that
				// screenshot (which a settle's answer may carry instead),
				// and it cuts off a call still going then. Each look it
				// begins leaves room for itself and the screenshot, so a
				// look that reached the guest after the deadline was begun
				// too late, not delivered late; the cut-off reaches the
				// guest within a scheduling delay, allowed one second.
				if len(calls) == 0 {
					t.Fatalf("max %v: the wait made no guest call", max)
				}
				looks := calls
				if last := calls[len(calls)-1]; last.path == "/screenshot" {
					looks = calls[:len(calls)-1]
				}
				for _, c := range looks {
					if c.at.After(deadline) {
						t.Errorf("max %v: %s began %v after the deadline; only the final screenshot may", max, c.path, c.at.Sub(deadline))
					}
					if late := c.end.Sub(deadline); late > time.Second {
						t.Errorf("max %v: %s went on %v past the deadline; the wait should have cut it off", max, c.path, late)
					}
				}
			}
			for _, max := range []time.Duration{3 * time.Second, 2500 * time.Millisecond, 4 * time.Second} {
				wait(max)
			}
			if noDamage {
				return
			}
			hangSettle.Store(true)
			defer hangSettle.Store(false)
			hung := len(proxy.hung)
			wait(3 * time.Second)
			if len(proxy.hung) == hung {
				t.Errorf("no settle hung in the guest: the cut-off was not tested")
			}
		})
	}
}
