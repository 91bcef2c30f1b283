package osworld

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

// countingProxy forwards to the guest server at target and counts the
// requests by path.
type countingProxy struct {
	mu    sync.Mutex
	paths []string
}

func (c *countingProxy) start(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.paths = append(c.paths, r.URL.Path)
		c.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// take returns the paths requested since the last take.
func (c *countingProxy) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.paths
	c.paths = nil
	return p
}

// sameShots checks that the executor's screenshot shot shows what the guest
// server's /screenshot shows, pixel for pixel, and that the executor gives
// the same bytes for the same screen. On a loaded machine the screen can
// still change after a settle (a shell's prompt arriving late): then the
// check is made again on the screen as it is, at most three times.
func sameShots(t *testing.T, d *Desktop, code string, shot []byte) {
	t.Helper()
	ctx := t.Context()
	var whys []string
	for range 3 {
		theirs, err := d.guest.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		again, err := d.WaitReady(ctx, 20*time.Second)
		if err != nil || !again.Settled {
			t.Fatalf("%q: wait again: %v", code, err)
		}
		why, err := diffPixels(shot, theirs.PNG)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case why == "" && bytes.Equal(again.Observation.Screenshot, shot):
			return
		case why != "":
			whys = append(whys, "the executor's screenshot and /screenshot differ: "+why)
		default:
			whys = append(whys, "two screenshots of the same screen differ in their bytes")
		}
		// The screen moved on: check the one it settled on now.
		shot = again.Observation.Screenshot
	}
	t.Errorf("%q: three times %q", code, whys)
}

// TestStepOneRoundTrip: with the executor, an action, the wait for the
// screen and the screenshot are one request to the guest server, and the
// first observation after a reset is the screen the wait after it ended
// on. The executor's screenshots show what /screenshot shows, pixel for
// pixel (the pointer too), and the same screen gives the same bytes.
func TestStepOneRoundTrip(t *testing.T) {
	g := startHostGuest(t)
	var proxy countingProxy
	d := g.desktop(t, g.config(t, proxy.start(t, g.URL)))
	ctx := t.Context()
	term := termTask(t, g)
	if err := d.Reset(ctx, term); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-term")
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	if d.shots != shotsAgree {
		t.Fatalf("after the first screenshot the executor's are %v, want trusted (%v)", d.shots, shotsAgree)
	}
	proxy.take()
	first, err := d.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := proxy.take(); len(p) != 0 {
		t.Errorf("the first Observe after the wait after reset asked the guest %q; want the wait's screen", p)
	}
	if first.Screenshot == nil || first.Width == 0 {
		t.Fatalf("first observation: %d bytes, %dx%d", len(first.Screenshot), first.Width, first.Height)
	}
	inWait := 0
	for i, code := range []string{
		`pyautogui.click(120, 90)`,
		`pyautogui.typewrite("echo one trip")`,
		`pyautogui.press("enter")`,
		`pyautogui.moveTo(700, 500)`,
	} {
		proxy.take()
		res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: code}, 20*time.Second)
		if err != nil || res.Act.ExitCode != 0 {
			t.Fatalf("%q: %+v, %v", code, res.Act, err)
		}
		if p := proxy.take(); len(p) != 1 || p[0] != "/execute" {
			t.Errorf("%q: the step asked the guest %q; want one /execute", code, p)
		}
		r := res.Ready
		if r.ShotInWait {
			inWait++
		}
		if !r.Settled || r.Capture <= 0 || r.Encode <= 0 || res.ActTime <= 0 {
			t.Errorf("%q: settled %v, capture %v, encode %v, act %v: want a settled screen taken in the guest", code, r.Settled, r.Capture, r.Encode, res.ActTime)
		}
		if i == 0 {
			// An RGB PNG of the executor's, not the server's RGBA one.
			if cfg, err := png.DecodeConfig(bytes.NewReader(r.Observation.Screenshot)); err != nil || cfg.ColorModel != color.RGBAModel {
				t.Errorf("%q: the screenshot is not the executor's RGB PNG: %v", code, err)
			}
		}
		sameShots(t, d, code, r.Observation.Screenshot)
	}
	// After a settled step, a settle that counts from that quiet ends at
	// one look; one that counts from its own start waits an interval.
	for _, tt := range []struct {
		window string
		long   bool
	}{{"settled", false}, {"", true}} {
		if _, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.moveTo(600, 400)`}, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		var a settleAnswer
		const interval = 5.0
		if _, err := d.callExecutor(ctx, executorRequest{Op: "settle", Max: 30, Interval: interval, MaxLoad: 1, MaxDamage: 1 << 20, Window: tt.window}, &a); err != nil {
			t.Fatal(err)
		}
		if !a.Settled || (a.Waited >= interval) != tt.long {
			t.Errorf("window %q: settled %v after %.2fs; want a wait of an interval (%vs): %v", tt.window, a.Settled, a.Waited, interval, tt.long)
		}
	}
	// The screenshot of a screen that went quiet is taken while the wait
	// makes sure it stays so (and checked against /screenshot above).
	if inWait == 0 {
		t.Errorf("no step took its screenshot while its wait ran")
	}
	// Without the executor a step still works, in more round trips.
	d.cfg.NoExecutor = true
	if err := d.Reset(ctx, term); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-term")
	proxy.take()
	res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.moveTo(700, 500)`}, 20*time.Second)
	if err != nil || res.Act.ExitCode != 0 || res.Ready.Observation.Screenshot == nil {
		t.Fatalf("without the executor: %+v, %v", res, err)
	}
	if p := proxy.take(); len(p) < 3 || !strings.Contains(strings.Join(p, " "), "/screenshot") {
		t.Errorf("without the executor the step asked %q; want the action, the wait and /screenshot", p)
	}
}

// TestStepShotsDiffer: where the executor's screenshots do not show what
// /screenshot shows (here: it draws no pointer, the server does), the
// desktop finds out on a still screen, warns, and takes every screenshot
// from /screenshot; steps go on.
func TestStepShotsDiffer(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	d.testPointer = "none"
	ctx := t.Context()
	term := termTask(t, g)
	if err := d.Reset(ctx, term); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-term")
	for i := range 4 {
		res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: fmt.Sprintf("pyautogui.moveTo(%d, 300)", 500+40*i)}, 20*time.Second)
		if err != nil || res.Act.ExitCode != 0 {
			t.Fatalf("step %d: %+v, %v", i, res.Act, err)
		}
		if res.Ready.Capture > 0 {
			t.Errorf("step %d: an executor screenshot was used although the check had not passed", i)
		}
		theirs, err := d.guest.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if why, err := diffPixels(res.Ready.Observation.Screenshot, theirs.PNG); why != "" || err != nil {
			t.Errorf("step %d: the observation is not /screenshot's screen: %s %v", i, why, err)
		}
	}
	if d.shots != shotsDiffer {
		t.Errorf("after 4 still screens the executor's screenshots are %v, want %v (not trusted)", d.shots, shotsDiffer)
	}
}

// termTask opens a small terminal titled legato-term.
func termTask(t *testing.T, g *hostGuest) desktop.Task {
	return task(t, "term", "legato_test", fmt.Sprintf(`{
	  "instruction": "Type.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-term", "-geometry", "60x10+40+40"]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath))
}

// clockTask opens a terminal titled legato-clock that prints the time
// every period (a sleep(1) argument): a screen that never settles.
func clockTask(t *testing.T, g *hostGuest, period string) desktop.Task {
	return task(t, "clock", "legato_test", fmt.Sprintf(`{
	  "instruction": "Watch.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-clock", "-e", "sh", "-c", "while sleep %s; do date +%%s.%%N; done"]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath, period))
}

// TestStepUnsettled: a step whose screen never settles says so, with the
// whole wait as its After (the record marks such a step unsettled).
func TestStepUnsettled(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	if err := d.Reset(ctx, clockTask(t, g, "0.02")); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-clock")
	// On a loaded machine the clock (xterm, Xvfb) may get no CPU for a
	// whole quiet interval: the screen then really was quiet, and the step
	// rightly says settled. A step that never says unsettled in five tries
	// is what fails.
	var settled []time.Duration
	for range 5 {
		res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.moveTo(300, 300)`}, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ready.Settled {
			settled = append(settled, res.Ready.After)
			continue
		}
		if res.Ready.After <= 0 || res.Ready.Observation.Screenshot == nil {
			t.Errorf("unsettled after %v with %d bytes; want a wait and a screen", res.Ready.After, len(res.Ready.Observation.Screenshot))
		}
		return
	}
	t.Errorf("a clock ticking every 20 ms settled in five steps of five, after %v; want unsettled", settled)
}

// TestUnsettledStart: an attempt whose screen does not settle within the
// wait after its reset says so in its report (the record's
// env.unsettled_start); the next reset forgets it, and a still screen
// does not say it.
func TestUnsettledStart(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	cfg.Ready.AfterResetMax = 3 * time.Second
	d := g.desktop(t, cfg)
	ctx := t.Context()
	// start resets to task and waits after the reset; it reports whether
	// the start was unsettled. The report must say nothing of it before
	// the wait, whatever the last start was.
	start := func(task desktop.Task) bool {
		t.Helper()
		if err := d.Reset(ctx, task); err != nil {
			t.Fatal(err)
		}
		if d.AttemptReport().UnsettledStart {
			t.Error("the report says the start is unsettled after the reset, before the wait after it")
		}
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		return d.AttemptReport().UnsettledStart
	}
	// As in TestStepUnsettled: on a loaded machine the clock may stall
	// for a quiet interval, and the wait then rightly ends settled.
	unsettled := false
	for range 5 {
		if unsettled = start(clockTask(t, g, "0.02")); unsettled {
			break
		}
	}
	if !unsettled {
		t.Error("a clock ticking every 20 ms: five starts said settled; want one unsettled")
	}
	// The same program printing nothing: a still screen, given all the
	// time a loaded machine needs to start it.
	d.cfg.Ready.AfterResetMax = time.Minute
	if start(clockTask(t, g, "1000")) {
		t.Error("a still screen: the report says the start is unsettled")
	}
}

// TestArrowLikeServer: the executor draws the pointer of legato's guest
// server; shot.py's arrow must be the server's, or the two screenshots
// never agree.
func TestArrowLikeServer(t *testing.T) {
	server, err := os.ReadFile(filepath.Join("testdata", "guest", "server.py"))
	if err != nil {
		t.Fatal(err)
	}
	arrow := regexp.MustCompile(`(?s)\nARROW = \[.*?\n\]`)
	want, got := arrow.Find(server), arrow.Find([]byte(shotPySrc))
	if want == nil || !bytes.Equal(want, got) {
		t.Errorf("shot.py's ARROW:\n%s\nis not server.py's:\n%s", got, want)
	}
}

func TestDiffPixels(t *testing.T) {
	enc := func(img image.Image) []byte {
		var b bytes.Buffer
		if err := png.Encode(&b, img); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	rgba := image.NewRGBA(image.Rect(0, 0, 5, 4))
	nrgba := image.NewNRGBA(image.Rect(0, 0, 5, 4))
	for y := range 4 {
		for x := range 5 {
			c := color.RGBA{uint8(40 * x), uint8(50 * y), 7, 255}
			rgba.Set(x, y, c)
			nrgba.Set(x, y, c)
		}
	}
	if why, err := diffPixels(enc(rgba), enc(nrgba)); why != "" || err != nil {
		t.Errorf("the same pixels, RGB and RGBA PNGs: %q %v", why, err)
	}
	nrgba.Set(3, 2, color.RGBA{1, 2, 3, 255})
	if why, _ := diffPixels(enc(rgba), enc(nrgba)); why != "1 pixels differ, the first at (3, 2)" {
		t.Errorf("one pixel changed: %q", why)
	}
	if why, _ := diffPixels(enc(rgba), enc(image.NewRGBA(image.Rect(0, 0, 5, 5)))); !strings.Contains(why, "sizes") {
		t.Errorf("other sizes: %q", why)
	}
	if _, err := diffPixels([]byte("not a png"), enc(rgba)); err == nil {
		t.Error("no error for a broken PNG")
	}
}

// deferredPauseTest drives the executor's DeferredPause on a module shaped
// as pyautogui (each call ends in _handlePause) with a clock of its own:
// it prints the sleeps the pause took, one line per case.
const deferredPauseTest = `
import sys, types
ns = {"__name__": "legato_executor"}
exec(compile(sys.argv[1], "<executor>", "exec"), ns)

class Clock:
    now = 100.0
    slept = []
    def monotonic(self):
        return self.now
    def sleep(self, s):
        self.slept.append(round(s, 3))
        self.now += s
clock = Clock()
ns["time"] = clock

gui = types.ModuleType("gui")
gui.PAUSE = 0.1
def _handlePause(_pause=True):
    assert isinstance(gui.PAUSE, (int, float)), "PAUSE"
    if _pause:
        clock.sleep(gui.PAUSE)
gui._handlePause = _handlePause
def click(_pause=True):
    gui._handlePause(_pause)
gui.click = click
pause = ns["DeferredPause"](gui)

def case(name, action):
    clock.slept.clear()
    try:
        action()
    except AssertionError as e:
        clock.slept.append("AssertionError " + str(e))
    pause.drop()
    print(name, clock.slept)

case("last call", lambda: click())
case("two calls", lambda: (click(), click()))
def then_print():
    click()
    clock.now += 0.04  # 40 ms of the action's own work
    len("x")
case("call then other work", then_print)
case("no pause asked", lambda: (click(_pause=False), click(_pause=False)))
def bad_pause():
    gui.PAUSE = "x"
    click()
case("PAUSE not a number", bad_pause)
`

// runWithExecutor runs a Python test program with the executor's text as
// its argv[1] (skipped without python3) and returns what it printed.
func runWithExecutor(t *testing.T, program string) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	out, err := exec.Command("python3", "-I", "-S", "-c", program, executorSrc).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	return string(out)
}

// TestDeferredPause: the pause pyautogui sleeps after a call is slept
// before whatever the action does next, and not after its last call.
func TestDeferredPause(t *testing.T) {
	out := runWithExecutor(t, deferredPauseTest)
	want := `last call []
two calls [0.1]
call then other work [0.06]
no pause asked []
PAUSE not a number ['AssertionError PAUSE']
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("the pauses slept (-want +got):\n%s", diff)
	}
}

// TestStepWaitsForALateRedraw: a program that draws a key at once and
// redraws a line of its window 0.45 s later (as LibreOffice's status bar
// counts a keystroke), longer than the quiet interval after the key. The
// first step's screenshot may miss that redraw; the executor sees it come
// after its answer, and the steps after it wait for it: each screenshot is
// the screen as it then stays.
func TestStepWaitsForALateRedraw(t *testing.T) {
	g := startHostGuest(t)
	d := g.desktop(t, g.config(t, g.URL))
	ctx := t.Context()
	// The late redraw grows a bar, a new region each time: a region
	// redrawn with two contents is taken for a blinking cursor.
	const late = `stty -echo -icanon; bar=
while c=$(dd bs=1 count=1 2>/dev/null); do
  printf %s "$c"; sleep 0.45; bar="$bar#"; printf '\033[s\033[8;1H%s\033[u' "$bar"
done`
	term := task(t, "late", "legato_test", fmt.Sprintf(`{
	  "instruction": "Type.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-term", "-geometry", "60x10+40+40", "-e", "sh", "-c", %q]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath, late))
	if err := d.Reset(ctx, term); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-term")
	if _, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.click(120, 90)`}, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if iv := d.executorInterval(waitFor{shot: true}); iv >= 450*time.Millisecond {
		t.Fatalf("the quiet interval %v is not shorter than the program's late redraw", iv)
	}
	for i, key := range "abcdef" {
		code := fmt.Sprintf("pyautogui.write(%q)", string(key))
		res, err := d.Step(ctx, desktop.Action{Kind: desktop.Code, Code: code}, 20*time.Second)
		if err != nil || res.Act.ExitCode != 0 || !res.Ready.Settled {
			t.Fatalf("%s: %+v, settled %v, %v", code, res.Act, res.Ready.Settled, err)
		}
		why, err := diffPixels(res.Ready.Observation.Screenshot, stillScreen(t, d))
		if err != nil {
			t.Fatal(err)
		}
		// The first key's screenshot is what it learns from.
		if i > 0 && why != "" {
			t.Errorf("%s: the step's screenshot (after %v) is not the screen it settled into: %s", code, res.Ready.After, why)
		}
	}
}

// lateRedrawTest drives Executor.learn and Executor.late_wait over made-up
// damage (the executor's text in argv[1]; time in seconds from 0).
const lateRedrawTest = `
import sys
ns = {"__name__": "legato_executor"}
exec(compile(sys.argv[1], "<executor>", "exec"), ns)

def executor(lates=(), events=()):
    ex = ns["Executor"].__new__(ns["Executor"])
    ex.lates = ns["collections"].deque(lates, maxlen=ns["LATE_KEEP"])
    ex.answered = None
    ex.watcher = ns["Watcher"]()
    ex.watcher.events.extend(events)
    return ex

def wait(name, lates, events, now):
    late, seen = executor(lates, events).late_wait(0.0, now, 0.3, 64)
    print(name, late, round(seen, 2))

# An echo at 0.05 (1000 pixels); the late redraw learned: 0.45 s after the quiet began.
echo = (0.05, 1000, False)
wait("nothing learned", [], [echo], 0.4)
wait("learned none came", [0.0, 0.0], [echo], 0.4)
wait("learned, not yet", [0.45], [echo], 0.4)
wait("learned, quiet past it", [0.45], [echo], 0.05 + 0.56)
wait("learned, it came", [0.45], [echo, (0.5, 5000, False)], 0.8)
wait("learned, a repeat came", [0.45], [echo, (0.5, 5000, True)], 0.55)
wait("learned, small damage, quiet past it", [0.45], [echo, (0.3, 40, False)], 0.7)
wait("learned, shorter than the interval", [0.15], [echo], 0.4)
wait("learned, past the horizon", [5.0], [echo], 0.05 + 1.09)

def learn(name, lates, events, answered, arrival):
    ex = executor(lates, events)
    ex.answered = answered
    ex.learn(arrival)
    print(name, [round(v, 2) for v in ex.lates], round(ex.late_delay(), 2))

# A settle answered at 0.35, its quiet from 0.05.
learn("late redraw", [], [echo, (0.5, 5000, False)], (0.35, 0.05, 64, 0.0), 2.0)
learn("small or repeated damage", [], [echo, (0.5, 40, False), (0.6, 5000, True)], (0.35, 0.05, 64, 0.0), 2.0)
learn("past the horizon", [], [echo, (1.2, 5000, False)], (0.35, 0.05, 64, 0.0), 2.0)
learn("after the next request", [], [echo, (0.9, 5000, False)], (0.35, 0.05, 64, 0.0), 0.8)
learn("next request too soon to say", [0.45], [echo], (0.35, 0.05, 64, 0.0), 0.8)
learn("waited for it and it came", [0.45], [echo], (0.85, 0.5, 64, 0.45), 0.9)
learn("forgotten after LATE_KEEP settles", [0.45, 0.0, 0.0, 0.0], [echo], (0.35, 0.05, 64, 0.0), 2.0)
learn("no settle to learn from", [0.45], [echo, (0.5, 5000, False)], None, 2.0)
`

// TestLateRedrawDecisions: when a settle after an action waits on for a
// program's late redraw, and what the executor learns between settles.
func TestLateRedrawDecisions(t *testing.T) {
	out := runWithExecutor(t, lateRedrawTest)
	want := `nothing learned False 0.0
learned none came False 0.0
learned, not yet True 0.0
learned, quiet past it False 0.0
learned, it came False 0.45
learned, a repeat came True 0.0
learned, small damage, quiet past it False 0.0
learned, shorter than the interval False 0.0
learned, past the horizon True 0.0
late redraw [0.45] 0.45
small or repeated damage [0.0] 0.0
past the horizon [0.0] 0.0
after the next request [] 0.0
next request too soon to say [0.45] 0.45
waited for it and it came [0.45, 0.45] 0.45
forgotten after LATE_KEEP settles [0.0, 0.0, 0.0, 0.0] 0.0
no settle to learn from [0.45] 0.45
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("late redraw decisions (-want +got):\n%s", diff)
	}
}
