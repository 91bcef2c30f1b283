package osworld

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
)

// executorActions are actions whose results tell a fresh interpreter from
// one that ran actions before: output on both streams and from programs it
// starts, tracebacks, syntax errors, exit statuses, the namespace and
// pyautogui's settings (each action starts from the import's), text
// decoding, the working directory and the environment.
var executorActions = []string{
	`pyautogui.moveTo(321, 234); print(pyautogui.position())`,
	`import sys; print("out"); print("err", file=sys.stderr); print("out2")`,
	`import subprocess; print("before", flush=True); subprocess.run(["echo", "child"]); print("after")`,
	`print(__name__, __import__("sys").argv, pyautogui.FAILSAFE, pyautogui.PAUSE)`,
	`secret = 41; pyautogui.PAUSE = 7; pyautogui.FAILSAFE_POINTS.append((5, 5))`,
	`print(pyautogui.PAUSE, pyautogui.FAILSAFE_POINTS); print(secret)`,
	`def f():\n    raise ValueError("boom")\nf()`,
	`x = (`,
	`import sys; sys.exit(3)`,
	`import sys; sys.exit("bye")`,
	`import sys; sys.exit(256 + 7)`,
	`exit()`,
	`print("é\r\nline\rend", end="")`,
	`import os; os.write(1, b"raw fd\n"); print("buffered")`,
	`import os; os.chdir("/"); os.environ["LEGATO_LEAK"] = "1"; print(os.getcwd())`,
	`import os; print(os.getcwd() != "/", os.environ.get("LEGATO_LEAK"))`,
}

// TestExecutorRunsActionsAsPythonDoes runs each action through `python -c`
// (OSWorld's way) and through the executor, and wants the same output,
// errors and exit status, and the same pointer after each.
func TestExecutorRunsActionsAsPythonDoes(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	if err := d.Reset(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if !d.exec.usable() {
		t.Fatal("the reset started no executor")
	}
	pointer := func() string { return g.sh(t, "xdotool getmouselocation") }
	for _, code := range executorActions {
		want, err := d.guest.RunPyautogui(ctx, code)
		if err != nil {
			t.Fatalf("%q through python -c: %v", code, err)
		}
		wantPointer := pointer()
		got, _, _, ran, err := d.actExecutor(ctx, code, nil)
		if err != nil || !ran {
			t.Fatalf("%q through the executor: ran %v, %v", code, ran, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%q: executor result differs from python -c (-python +executor):\n%s", code, diff)
		}
		if p := pointer(); p != wantPointer {
			t.Errorf("%q: pointer at %q after the executor, %q after python -c", code, p, wantPointer)
		}
	}
	if !d.exec.usable() {
		t.Errorf("the executor went down: %+v", d.exec)
	}
}

// TestExecutorSameScreen runs the same steps (a click into a terminal,
// typing, keys, a move) from the same reset once through `python -c` and
// once through the executor, and wants the same screen after each step.
func TestExecutorSameScreen(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	term := termTask(t, g)
	steps := []string{
		`pyautogui.click(120, 90)`,
		`pyautogui.typewrite("echo same")`,
		`pyautogui.press("enter"); pyautogui.typewrite("x" * 3); pyautogui.hotkey("ctrl", "u")`,
		`pyautogui.moveTo(700, 500)`,
	}
	run := func(noExecutor bool) [][]byte {
		d.cfg.NoExecutor = noExecutor
		if err := d.Reset(ctx, term); err != nil {
			t.Fatal(err)
		}
		g.WaitWindow(t, "legato-term")
		if _, err := d.readySignal(ctx, 20*time.Second, waitFor{shot: true}); err != nil {
			t.Fatal(err)
		}
		if d.exec.usable() == noExecutor {
			t.Fatalf("NoExecutor %v, executor %+v", noExecutor, d.exec)
		}
		var shots [][]byte
		for _, s := range steps {
			r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: s})
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("%q: %+v, %v", s, r, err)
			}
			ready, err := d.WaitReady(ctx, 20*time.Second)
			if err != nil || !ready.Settled {
				t.Fatalf("%q: the screen did not settle: %v", s, err)
			}
			// On a loaded machine xterm can repaint after the settle's
			// quiet window (its cursor fills when the click gives it the
			// focus): compare the screens the steps end on. That the
			// executor's own screenshots show the screen pixel for pixel is
			// TestStepOneRoundTrip's.
			shots = append(shots, stillScreen(t, d))
		}
		return shots
	}
	want := run(true)
	got := run(false)
	for i := range steps {
		if why, err := diffPixels(got[i], want[i]); why != "" || err != nil {
			t.Errorf("after %q the screen differs between python -c and the executor: %s %v", steps[i], why, err)
		}
	}
}

// stillScreen is the guest server's screenshot once two taken half a
// second apart show the same pixels.
func stillScreen(t *testing.T, d *Desktop) []byte {
	t.Helper()
	ctx := t.Context()
	last, err := d.guest.Screenshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 40 {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
		now, err := d.guest.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		why, err := diffPixels(now.PNG, last.PNG)
		if err != nil {
			t.Fatal(err)
		}
		if why == "" {
			return now.PNG
		}
		last = now
	}
	t.Fatal("the screen did not hold still for half a second in 20 s")
	return nil
}

// TestExecutorFallsBack: an executor that is gone leaves actions to
// `python -c`, with the same results; the next reset starts a new one.
func TestExecutorFallsBack(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	if err := d.Reset(ctx, plain); err != nil {
		t.Fatal(err)
	}
	const code = `print(pyautogui.PAUSE)`
	first, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: code})
	if err != nil || first.ExitCode != 0 || !d.exec.usable() {
		t.Fatalf("act: %+v, %v; executor %+v", first, err, d.exec)
	}
	g.sh(t, fmt.Sprintf(`kill -9 $(cat %s/pid)`, d.exec.dir))
	again, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: code})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("after the executor died (-executor +python -c):\n%s", diff)
	}
	if !d.exec.down {
		t.Errorf("the desktop did not notice its executor died: %+v", d.exec)
	}
	// Dying in the middle of an action is the action's failure.
	if err := d.Reset(ctx, plain); err != nil {
		t.Fatal(err)
	}
	r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: `import os; os.kill(os.getpid(), 9)`})
	if err != nil || r.ExitCode == 0 || !strings.Contains(r.Error, "ended") {
		t.Errorf("an action that kills the executor: %+v, %v; want a failed action", r, err)
	}
	if err := d.Reset(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: code}); err != nil || r.ExitCode != 0 || !d.exec.usable() {
		t.Errorf("after a reset: %+v, %v; executor %+v", r, err, d.exec)
	}
	if _, err := d.guest.Execute(ctx, guest.Argv("true")); err != nil {
		t.Fatal(err)
	}
}

// TestExecutorSettle: the executor's ready signal settles on a blinking
// cursor, which holds the probes' signal to its bound (every Interval has
// a toggle of more than MaxDamage pixels), and never on a one-character
// spinner or a clock.
func TestExecutorSettle(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	// Longer than xterm's cursor phases (600 ms on, 300 ms off).
	cfg.Ready.Interval = 700 * time.Millisecond
	d := g.desktop(t, cfg)
	ctx := t.Context()
	const bound = 6 * time.Second
	for _, tt := range []struct {
		name    string
		args    string
		settles bool
	}{
		{"blinking cursor", `"-bc", "-e", "sh", "-c", "printf ready; exec sleep 1000"`, true},
		{"spinner", `"-e", "sh", "-c", "while :; do for c in a b c d; do printf '\\b%s' $c; sleep 0.15; done; done"`, false},
		{"clock", `"-e", "sh", "-c", "while sleep 0.02; do date +%s.%N; done"`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			term := task(t, "term", "legato_test", fmt.Sprintf(`{
			  "instruction": "Watch.",
			  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-term", %s]}}],
			  "evaluator": {"func": "infeasible"}}`, g.AppPath, tt.args))
			if err := d.Reset(ctx, term); err != nil {
				t.Fatal(err)
			}
			g.WaitWindow(t, "legato-term")
			waitChanging(t, d)
			r, err := d.WaitReady(ctx, bound)
			if err != nil {
				t.Fatal(err)
			}
			if r.Settled != tt.settles || !d.exec.usable() || d.exec.noWatch {
				t.Errorf("executor: settled %v after %v, want settled %v (executor %+v)", r.Settled, r.After, tt.settles, d.exec)
			}
			if !tt.settles {
				return
			}
			// The probes' signal, for comparison: held to its bound.
			d.exec.noWatch = true
			defer func() { d.exec.noWatch = false }()
			r, err = d.WaitReady(ctx, bound)
			if err != nil {
				t.Fatal(err)
			}
			if r.Settled {
				t.Errorf("the probes settled after %v: the cursor does not blink, or blinks less than MaxDamage", r.After)
			}
		})
	}
}

func TestExecutorBase(t *testing.T) {
	for _, tt := range []struct {
		restore []string
		want    string
	}{
		{nil, "/dev/shm"},
		{DefaultRestoreDirs(), "/dev/shm"},
		{[]string{"/tmp", "/srv/x"}, "/tmp"},
		{[]string{"/srv/x", "/srv/y"}, "/srv/x"},
	} {
		c := Config{FastReset: FastResetConfig{Restore: tt.restore}}
		if got := c.executorBase(); got != tt.want {
			t.Errorf("Restore %q: executor directory in %q, want %q", tt.restore, got, tt.want)
		}
	}
}
