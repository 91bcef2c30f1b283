package osworld

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/guest/guesttest"
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

// cursorProbe prints, as JSON, the pointer's place and its cursor image as
// the X server shows it (x11.py comes first): how many of its pixels are
// partly transparent (an anti-aliased theme's edges), and the screen's
// pixels its opaque ones make, with the colour OSWorld's server draws them
// in (red and blue swapped).
const cursorProbe = `
import json
x = X()
px, py, _ = x.pointer()
w, h, argb = x.cursor_image()
partial, opaque = 0, []
for i in range(w * h):
    b, g, r, a = argb[i * 4:i * 4 + 4]
    partial += 0 < a < 255
    sx, sy = px + i % w, py + i // w
    if a == 255 and sx < x.width and sy < x.height:
        opaque.append([sx, sy, b, g, r])
print(json.dumps({"x": px, "y": py, "partial": partial, "opaque": opaque}))
`

// TestExecutorOSWorldPointer: on a guest server that draws the pointer as
// OSWorld's does (legato's with --pointer osworld: the X cursor image
// pasted at the pointer), the executor knows it, and its screenshots show
// what /screenshot shows, pixel for pixel, with an anti-aliased cursor
// theme: the pointer over text, over a button, over the bare desktop, and
// cut by the screen's edges.
func TestExecutorOSWorldPointer(t *testing.T) {
	const theme = "/usr/share/icons/Adwaita/cursors/left_ptr"
	if _, err := os.Stat(theme); err != nil {
		t.Fatalf("no anti-aliased cursor theme (%v): install the Debian package adwaita-icon-theme", err)
	}
	xmessage, err := exec.LookPath("xmessage")
	if err != nil {
		t.Fatal("xmessage not found: install the Debian package x11-utils")
	}
	g := startHostGuestWith(t, guesttest.Options{
		ServerArgs: []string{"--pointer", "osworld"},
		Env:        []string{"XCURSOR_THEME=Adwaita", "XCURSOR_SIZE=24"},
	})
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	setup := task(t, "pointer", "legato_test", fmt.Sprintf(`{
	  "instruction": "Point.",
	  "config": [
	    {"type": "launch", "parameters": {"command": [%q, "-T", "legato-text", "-geometry", "40x8+40+40",
	      "-e", "sh", "-c", "seq -w 1000 1200 | tr '\\n' ' '; exec cat"]}},
	    {"type": "launch", "parameters": {"command": [%q, "-title", "legato-button", "-geometry", "+600+300",
	      "-buttons", "OK", "Press it."]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath, xmessage))
	if err := d.Reset(ctx, setup); err != nil {
		t.Fatal(err)
	}
	text := g.WaitWindow(t, "legato-text")
	button := g.WaitWindow(t, "legato-button")
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	if d.shots != shotsAgree {
		t.Fatalf("after the first screenshot the executor's are %v, want trusted (%v)", d.shots, shotsAgree)
	}
	var pong struct {
		Pointer string `json:"pointer"`
		Why     string `json:"pointer_why"`
	}
	if _, err := d.callExecutor(ctx, executorRequest{Op: "ping"}, &pong); err != nil || pong.Pointer != "osworld" {
		t.Fatalf("the executor draws the pointer as %q (%s), %v; want osworld", pong.Pointer, pong.Why, err)
	}
	tx, ty, tw, th := windowGeometry(t, g, text)
	bx, by := bottomChild(t, g, button)
	for _, p := range []struct {
		name string
		x, y int
	}{
		{"over text", tx + tw/3, ty + th/2},
		{"over a button", bx, by},
		{"over the desktop", g.Width * 3 / 4, g.Height / 4},
		{"cut by the right and bottom edges", g.Width - 12, g.Height - 10},
		{"cut by the right edge", g.Width - 9, g.Height / 2},
	} {
		code := fmt.Sprintf("pyautogui.moveTo(%d, %d)", p.x, p.y)
		res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: code}, 20*time.Second)
		if err != nil || res.Act.ExitCode != 0 {
			t.Fatalf("%s: %+v, %v", p.name, res.Act, err)
		}
		if res.Ready.Capture <= 0 {
			t.Errorf("%s: the step's screenshot is not the executor's", p.name)
		}
		shot := res.Ready.Observation.Screenshot
		sameShots(t, d, code, shot)

		out, err := d.sh.run(ctx, `exec python3 -I -S -c "$1"`, x11Src+cursorProbe)
		if err != nil || out.ReturnCode != 0 {
			t.Fatalf("%s: cursor probe: %v %+v", p.name, err, out)
		}
		var c struct {
			X, Y    int
			Partial int
			Opaque  [][5]int
		}
		if err := json.Unmarshal([]byte(out.Output), &c); err != nil {
			t.Fatalf("%s: cursor probe %q: %v", p.name, out.Output, err)
		}
		if c.X != p.x || c.Y != p.y {
			t.Fatalf("%s: the pointer is at (%d, %d), want (%d, %d)", p.name, c.X, c.Y, p.x, p.y)
		}
		t.Logf("%s: the pointer at (%d, %d), its cursor %d partly transparent pixels, %d opaque on the screen", p.name, c.X, c.Y, c.Partial, len(c.Opaque))
		if c.Partial == 0 {
			t.Errorf("%s: the cursor has no partly transparent pixels: no anti-aliased theme in effect "+
				"(XCURSOR_THEME; the Debian packages adwaita-icon-theme and libxcursor1)", p.name)
		}
		if len(c.Opaque) == 0 {
			t.Fatalf("%s: no opaque pixel of the cursor on the screen", p.name)
		}
		// The pointer is in the screenshot, where OSWorld's server puts it.
		img, err := png.Decode(bytes.NewReader(shot))
		if err != nil {
			t.Fatal(err)
		}
		pix, w := rgb(img), img.Bounds().Dx()
		for _, o := range c.Opaque {
			i := (o[1]*w + o[0]) * 3
			if got := [3]int{int(pix[i]), int(pix[i+1]), int(pix[i+2])}; got != [3]int{o[2], o[3], o[4]} {
				t.Errorf("%s: at (%d, %d) the screenshot has %v, the cursor's opaque %v", p.name, o[0], o[1], got, o[2:])
				break
			}
		}
	}
}

// windowGeometry is a window's place and size on the screen.
func windowGeometry(t *testing.T, g *hostGuest, id string) (x, y, w, h int) {
	t.Helper()
	v := map[string]int{}
	for _, line := range strings.Fields(g.sh(t, "xdotool getwindowgeometry --shell "+id)) {
		k, val, _ := strings.Cut(line, "=")
		n, err := strconv.Atoi(val)
		if err == nil {
			v[k] = n
		}
	}
	if v["WIDTH"] == 0 || v["HEIGHT"] == 0 {
		t.Fatalf("window %s: geometry %v", id, v)
	}
	return v["X"], v["Y"], v["WIDTH"], v["HEIGHT"]
}

// bottomChild is the middle of the lowest of a window's descendants (of
// xmessage's, its button).
func bottomChild(t *testing.T, g *hostGuest, id string) (x, y int) {
	t.Helper()
	geom := regexp.MustCompile(`(\d+)x(\d+)\+-?\d+\+-?\d+\s+\+(-?\d+)\+(-?\d+)`)
	best := -1
	for _, m := range geom.FindAllStringSubmatch(g.sh(t, "xwininfo -tree -id "+id), -1) {
		var n [4]int
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		if n[3] > best {
			best, x, y = n[3], n[2]+n[0]/2, n[3]+n[1]/2
		}
	}
	if best < 0 {
		t.Fatalf("window %s has no child windows", id)
	}
	return x, y
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
