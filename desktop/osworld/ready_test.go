package osworld

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop"
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
	waited, err := d.WaitReady(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if waited >= long {
		t.Errorf("still screen: WaitReady waited its whole bound (%v)", waited)
	}

	// A clock printing every 50 ms: the screen never settles.
	clock := task(t, "clock", "legato_test", fmt.Sprintf(`{
	  "instruction": "Watch.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-clock", "-e", "sh", "-c", "while sleep 0.05; do date +%%s.%%N; done"]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath))
	if err := d.Reset(ctx, clock); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-clock")
	const short = 1500 * time.Millisecond
	waited, err = d.WaitReady(ctx, short)
	if err != nil {
		t.Fatal(err)
	}
	if waited < short {
		t.Errorf("changing screen: WaitReady returned ready after %v, before its bound %v", waited, short)
	}
}

// TestFixedWaits: with the ready signal off, the waits are the configured
// sleeps (WaitReady's capped by its bound), and no screenshot is taken.
func TestFixedWaits(t *testing.T) {
	g := startHostGuest(t)
	var armed atomic.Bool // attaching takes a screenshot
	proxy := newHangProxy(t, g.URL, func(path string, _ []byte) bool { return path == "/screenshot" && armed.Load() })
	cfg := g.config(t, proxy.srv.URL)
	cfg.Ready = ReadyConfig{Disabled: true, FixedWait: 30 * time.Millisecond, FixedAfterReset: 10 * time.Millisecond}
	d := g.desktop(t, cfg)
	armed.Store(true)
	ctx := t.Context()
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitBeforeEval(ctx); err != nil { // defaults to FixedWait
		t.Fatal(err)
	}
	for _, tc := range []struct{ max, want time.Duration }{{time.Second, 30 * time.Millisecond}, {5 * time.Millisecond, 5 * time.Millisecond}} {
		got, err := d.WaitReady(ctx, tc.max)
		if err != nil || got != tc.want {
			t.Errorf("WaitReady(%v) = %v, %v; want %v", tc.max, got, err, tc.want)
		}
	}
	select {
	case <-proxy.hung:
		t.Error("a screenshot was taken with the ready signal off")
	default:
	}
}

// TestObserveReusesReadyScreenshot: the observation right after a wait that
// found the screen settled is the wait's last screenshot, not a new one;
// after any other call it is a new one.
func TestObserveReusesReadyScreenshot(t *testing.T) {
	g := startHostGuest(t)
	var shots atomic.Int64
	proxy := newHangProxy(t, g.URL, func(path string, _ []byte) bool {
		if path == "/screenshot" {
			shots.Add(1)
		}
		return false
	})
	d := g.desktop(t, g.config(t, proxy.srv.URL))
	ctx := t.Context()
	observe := func() int64 {
		t.Helper()
		before := shots.Load()
		obs, err := d.Observe(ctx)
		if err != nil || len(obs.Screenshot) == 0 || obs.At.IsZero() {
			t.Fatalf("Observe: %v, %d bytes at %v", err, len(obs.Screenshot), obs.At)
		}
		return shots.Load() - before
	}
	// A still screen settles within the bound; not reaching it is what
	// makes the screenshot reusable.
	if waited, err := d.WaitReady(ctx, time.Minute); err != nil || waited >= time.Minute {
		t.Fatalf("WaitReady: %v, %v", waited, err)
	}
	if n := observe(); n != 0 {
		t.Errorf("Observe after a settled wait took %d screenshots, want 0", n)
	}
	if n := observe(); n != 1 {
		t.Errorf("second Observe took %d screenshots, want 1", n)
	}
	if _, err := d.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Act(ctx, desktop.WaitAction); err != nil {
		t.Fatal(err)
	}
	if n := observe(); n != 1 {
		t.Errorf("Observe after an action took %d screenshots, want 1", n)
	}
}
