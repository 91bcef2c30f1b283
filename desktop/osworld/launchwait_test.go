package osworld

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"legato/rl/desktop"
)

// TestSetupWaitsForTheLaunchedWindow: a program launched through a shell
// that takes seconds to map its window (as VLC does under load) is on
// every attempt's first screen, the same on each: the setup waits for its
// window, then the settle for a quiet screen. Without the wait the screen
// is quiet while the program still starts, and the first screen is the
// empty desktop. A golden state is taken after the same setup, so on it
// too.
func TestSetupWaitsForTheLaunchedWindow(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	// A quiet interval long enough that a window mapped but not yet
	// drawn under a loaded host does not pass for a settled screen.
	cfg.Ready.Interval = 500 * time.Millisecond
	d := g.desktop(t, cfg)

	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	empty := attemptStart(t, d, plain)

	// The program: the test's own xterm, whose start the shell delays by
	// 4 s; it shows an empty terminal (no prompt that could differ).
	slow := fmt.Sprintf(`sleep 4; exec %s -T legato-slow -e sleep 600`, g.AppPath)
	for _, tc := range []struct{ name, step string }{
		{"launch through a shell", fmt.Sprintf(`{"type": "launch", "parameters": {"command": %q, "shell": true}}`, slow)},
		{"execute in the background", fmt.Sprintf(`{"type": "execute", "parameters": {"command": %q, "shell": true}}`,
			"("+slow+") </dev/null >/dev/null 2>&1 &")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := task(t, "slow-"+strings.ReplaceAll(tc.name, " ", "-"), "legato_test",
				`{"instruction": "Use the terminal.", "config": [`+tc.step+`], "evaluator": {"func": "infeasible"}}`)
			var shots [][]byte
			for attempt := 1; attempt <= 2; attempt++ {
				shot := attemptStart(t, d, tk)
				if bytes.Equal(shot, empty) {
					t.Fatalf("attempt %d: the first screen is the empty desktop; want the launched program's window on it", attempt)
				}
				if !strings.Contains(g.sh(t, "wmctrl -l"), "legato-slow") {
					t.Fatalf("attempt %d: no window legato-slow after the reset and its wait", attempt)
				}
				shots = append(shots, shot)
			}
			if !bytes.Equal(shots[0], shots[1]) {
				t.Error("the two attempts' first screens differ")
			}
		})
	}
}

// attemptStart resets d to tk and returns the attempt's first screen: the
// one the wait after the reset ended on.
func attemptStart(t *testing.T, d *Desktop, tk desktop.Task) []byte {
	t.Helper()
	ctx := t.Context()
	if err := d.Reset(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	obs, err := d.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return obs.Screenshot
}

// TestSetupWindowWaitEndsAtItsBound: a launched program that never maps a
// window holds the setup up to Ready.AfterLaunchMax, then a warning names
// the step and the program, and the attempt goes on.
func TestSetupWindowWaitEndsAtItsBound(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	const bound = 1500 * time.Millisecond
	cfg.Ready.AfterLaunchMax = bound
	rec := newWarnings(cfg.Logger.Handler())
	cfg.Logger = slog.New(rec)
	d := g.desktop(t, cfg)

	tk := task(t, "no-window", "legato_test", `{"instruction": "Nothing.",
	  "config": [{"type": "sleep", "parameters": {"seconds": 0}}, {"type": "launch", "parameters": {"command": ["sleep", "600"]}}],
	  "evaluator": {"func": "infeasible"}}`)
	t0 := time.Now()
	if err := d.Reset(t.Context(), tk); err != nil {
		t.Fatalf("a program without a window failed the reset: %v", err)
	}
	if took := time.Since(t0); took < bound {
		t.Errorf("the reset took %v; want the setup to wait for the window up to its bound, %v", took, bound)
	}
	var found []string
	for _, w := range rec.taken() {
		if strings.Contains(w["msg"], "mapped no window") {
			found = append(found, fmt.Sprint(w))
			for k, v := range map[string]string{"task": "no-window", "step": "2", "type": "launch", "program": "sleep", "waited": bound.String()} {
				if w[k] != v {
					t.Errorf("warning %v: %s = %q, want %q", w, k, w[k], v)
				}
			}
		}
	}
	if len(found) != 1 {
		t.Errorf("warnings that the program mapped no window: %q; want one", found)
	}
}

// warnings records the warnings logged, and passes every record on.
type warnings struct {
	next  slog.Handler
	attrs []slog.Attr
	mu    *sync.Mutex
	got   *[]map[string]string
}

func newWarnings(next slog.Handler) *warnings {
	return &warnings{next: next, mu: &sync.Mutex{}, got: &[]map[string]string{}}
}

func (w *warnings) Enabled(ctx context.Context, l slog.Level) bool { return w.next.Enabled(ctx, l) }

func (w *warnings) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		m := map[string]string{"msg": r.Message}
		for _, a := range w.attrs {
			m[a.Key] = a.Value.String()
		}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		w.mu.Lock()
		*w.got = append(*w.got, m)
		w.mu.Unlock()
	}
	return w.next.Handle(ctx, r)
}

func (w *warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &warnings{next: w.next.WithAttrs(attrs), attrs: append(append([]slog.Attr{}, w.attrs...), attrs...), mu: w.mu, got: w.got}
}

// WithGroup is not used by the desktop's logs; the group's attributes
// are recorded without it.
func (w *warnings) WithGroup(name string) slog.Handler {
	return &warnings{next: w.next.WithGroup(name), attrs: w.attrs, mu: w.mu, got: w.got}
}

func (w *warnings) taken() []map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]string{}, *w.got...)
}
