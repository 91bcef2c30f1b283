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

// TestDeferredPause: the pause pyautogui sleeps after a call is slept
// before whatever the action does next, and not after its last call.
func TestDeferredPause(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	out, err := exec.Command("python3", "-I", "-S", "-c", deferredPauseTest, executorSrc).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	want := `last call []
two calls [0.1]
call then other work [0.06]
no pause asked []
PAUSE not a number ['AssertionError PAUSE']
`
	if diff := cmp.Diff(want, string(out)); diff != "" {
		t.Errorf("the pauses slept (-want +got):\n%s", diff)
	}
}
