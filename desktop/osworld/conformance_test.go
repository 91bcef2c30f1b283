package osworld

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/desktoptest"
)

// fileTask's setup writes a file in the home directory and its evaluator
// reads it back through the guest: Reset and Evaluate both reach the guest.
// "legato-grade" marks the grading command, so a proxy can hang it alone.
const fileTaskConfig = `{
  "instruction": "Leave the file as it is.",
  "config": [{"type": "execute", "parameters": {"command": ["sh", "-c", "echo legato-setup > ~/legato-eval.txt"]}}],
  "evaluator": {
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat ~/legato-eval.txt # legato-grade", "shell": true},
    "expected": {"type": "rule", "rules": {"expected": "legato-setup\n"}}
  }
}`

// TestConformance runs the desktop conformance suite on a guest given by
// URL: legato's guest server on the host, under Xvfb.
func TestConformance(t *testing.T) {
	g := startHostGuest(t)
	tasks := []desktop.Task{task(t, "file-task", "legato_test", fileTaskConfig), desktoptest.DefaultTask()}

	// One proxy per blocking method, made before the suite runs so that
	// their goroutines predate every check's snapshot.
	// The Observe proxy lets the screenshot that attaching takes through.
	var observeArmed atomic.Bool
	// The guest tool's text comes with each of its calls, JSON-escaped: a
	// command and its argument, unescaped, tell the calls apart.
	quiet := executeContains(`"quiet","`) // the ready signal's probe
	rules := map[desktoptest.Method]func(string, []byte) bool{
		desktoptest.MethodReset:          executeContains(`"reset","{`), // the fast reset
		desktoptest.MethodAct:            executeContains("import pyautogui"),
		desktoptest.MethodEvaluate:       executeContains("legato-grade"),
		desktoptest.MethodObserve:        func(path string, _ []byte) bool { return path == "/screenshot" && observeArmed.Load() },
		desktoptest.MethodWaitAfterReset: quiet,
		desktoptest.MethodWaitBeforeEval: quiet,
	}
	proxies := map[desktoptest.Method]*hangProxy{}
	for m, rule := range rules {
		proxies[m] = newHangProxy(t, g.URL, rule)
	}

	newDesktop := func(ctx context.Context, cfg Config) (desktop.Desktop, error) {
		p, err := NewPool(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return p.New(ctx, 0)
	}
	desktoptest.Run(t, func(t *testing.T) desktop.Desktop {
		d, err := newDesktop(t.Context(), g.config(t, g.URL))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}, desktoptest.Options{
		Tasks:  tasks,
		Width:  g.Width,
		Height: g.Height,
		Bound:  5 * time.Second,
		Blocking: func(ctx context.Context, m desktoptest.Method) (desktop.Desktop, error) {
			cfg := g.config(t, proxies[m].srv.URL)
			create := func(ctx context.Context, _ int) (desktop.Desktop, error) { return newDesktop(ctx, cfg) }
			switch m {
			case desktoptest.MethodObserve, desktoptest.MethodAct, desktoptest.MethodEvaluate:
				// No screenshots before the one that hangs.
				create = desktop.WithFixedWaits(create, desktop.FixedWaits{})
			case desktoptest.MethodWaitBeforeEval:
				// The wait after the reset must not reach the rule.
				cfg.Ready.AfterResetMax = time.Nanosecond
			}
			observeArmed.Store(false)
			d, err := create(ctx, 0)
			observeArmed.Store(true)
			return d, err
		},
	})
}
