//go:build integration

package osworld

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/internal/backoff"
)

// frameCost reads the whole screen back from the X server (GetImage, as
// the framebuffer hashing would every 50 ms) and hashes it, and a
// 78×23 region (what the executor reads back for a repeated region),
// reporting seconds per read and per hash.
const frameCost = `
import json, time, zlib
def grab(x, w, h):
    x.sock.sendall(struct.pack("<BBHIhhHHI", 73, 2, 5, x.root, 0, 0, w, h, 0xFFFFFFFF))
    head = x.recv(32)
    n = struct.unpack("<I", head[4:8])[0] * 4
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        got += x.sock.recv_into(view[got:], n - got)
    return buf
out = {}
with X() as x:
    g = x.request(struct.pack("<BxHI", 14, 2, x.root))
    w, h = struct.unpack("<HH", g[16:20])
    for name, (gw, gh) in (("full", (w, h)), ("region", (78, 23))):
        reads, hashes = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            buf = grab(x, gw, gh)
            t1 = time.perf_counter()
            zlib.crc32(buf)
            hashes.append(time.perf_counter() - t1)
            reads.append(t1 - t0)
        out[name] = {"size": [gw, gh], "bytes": len(buf), "read": reads, "hash": hashes}
print(json.dumps(out))
`

// TestIntegrationExecutor checks on a test guest VM that actions run by
// the executor give what `python -c` gives and that its ready signal
// settles on a blinking cursor; with -osworld.measure it also measures
// (logged, with -osworld.measure.out written as JSON): an action's time each way, the
// wait after an action with the executor's settle, the quiet probes,
// compared screenshots and a fixed 3 s, the same with a blinking cursor,
// and what reading back the screen costs in the guest.
func TestIntegrationExecutor(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-exec-")
	// The executor's answers, to see what held a wait.
	cfg.Logger = slog.New(debugOnly{slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}), "settle"})
	ctx := t.Context()
	d := itDesktop(t, cfg).Desktop
	n := *itReps
	res := map[string]*measurement{}
	m := func(k string) *measurement {
		if res[k] == nil {
			res[k] = &measurement{}
		}
		return res[k]
	}
	term := func(id string, args ...string) desktop.Task {
		cmd, _ := json.Marshal(append([]string{"xterm", "-xrm", "XTerm.vt100.allowTitleOps: false", "-T", id}, args...))
		return desktop.Task{ID: id, Domain: "legato_term", Instruction: "x", Evaluator: json.RawMessage(`{"func":"infeasible"}`),
			Setup: []desktop.SetupStep{
				{Type: "launch", Parameters: json.RawMessage(`{"command": ` + string(cmd) + `}`)},
				{Type: "execute_with_verification", Parameters: json.RawMessage(`{"command": ["true"], "verification": {"window_exists": "` + id + `"}, "max_wait_time": 90, "check_interval": 0.5}`)},
				{Type: "activate_window", Parameters: json.RawMessage(`{"window_name": "` + id + `"}`)},
			}}
	}
	if err := d.Reset(ctx, term("legato-exec")); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}

	// The same results both ways, on the guest's own Python.
	for _, code := range executorActions {
		want, err := d.guest.RunPyautogui(ctx, code)
		if err != nil {
			t.Fatalf("%q through python -c: %v", code, err)
		}
		got, _, _, ran, err := d.actExecutor(ctx, code, nil)
		if err != nil || !ran {
			t.Fatalf("%q through the executor: ran %v, %v", code, ran, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%q: executor result differs from python -c (-python +executor):\n%s", code, diff)
		}
	}
	if !d.exec.usable() {
		t.Fatalf("the executor went down: %+v", d.exec)
	}

	// An action's time each way: one that does nothing in the guest, and
	// typing a line into the terminal (pyautogui's 0.1 s pause after each
	// call included, as in OSWorld). Measurement only: -osworld.measure.
	for i := range measureReps(n) {
		for _, a := range []struct{ name, code string }{
			{"noop", "pass"},
			{"type_line", fmt.Sprintf("pyautogui.typewrite('echo act %d'); pyautogui.press('enter')", i)},
		} {
			t0 := time.Now()
			r, err := d.guest.RunPyautogui(ctx, a.code)
			if err != nil || r.ReturnCode != 0 {
				t.Fatalf("%s through python -c: %+v, %v", a.name, r, err)
			}
			m("act_" + a.name + "_python_c").add(time.Since(t0))
			t0 = time.Now()
			ar, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: a.code})
			if err != nil || ar.ExitCode != 0 {
				t.Fatalf("%s through the executor: %+v, %v", a.name, ar, err)
			}
			m("act_" + a.name + "_executor").add(time.Since(t0))
			if _, err := d.WaitReady(ctx, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}

	counter := &countingTransport{base: http.DefaultTransport}
	counted, err := guest.New(d.guest.URL(), guest.Options{HTTPClient: &http.Client{Transport: counter}})
	if err != nil {
		t.Fatal(err)
	}
	base := d.guest
	d.guest = counted
	defer func() { d.guest = base; counted.CloseIdleConnections() }()
	// waits runs steps (an action, then the wait for the screen) with each
	// ready signal.
	// Without -osworld.measure only the executor's own signal runs: the
	// other modes are there to be compared with it.
	modes := []string{"executor"}
	if *itMeasure {
		modes = append(modes, "executor_window_act", "executor_window_request", "probes", "compare_screenshots", "fixed_3s")
	}
	waits := func(scene string, step func(i int) string) {
		for _, mode := range modes {
			d.exec.noWatch = !strings.HasPrefix(mode, "executor")
			d.exec.window = strings.TrimPrefix(strings.TrimPrefix(mode, "executor"), "_window_")
			d.cfg.Ready.NoDamage = mode == "compare_screenshots"
			for i := range n {
				r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: step(i)})
				if err != nil || r.ExitCode != 0 {
					t.Fatalf("act: %+v, %v", r, err)
				}
				shots := counter.shots.Load()
				t0 := time.Now()
				settled := false
				if mode == "fixed_3s" {
					if err := backoff.Sleep(ctx, 3*time.Second); err != nil {
						t.Fatal(err)
					}
					if _, err := d.Observe(ctx); err != nil {
						t.Fatal(err)
					}
				} else {
					ready, err := d.WaitReady(ctx, 10*time.Second)
					if err != nil {
						t.Fatal(err)
					}
					settled = ready.Settled
					// When the signal found the screen ready, without the
					// screenshot that follows (compared screenshots: the first
					// of the identical ones).
					m(scene + "_ready_after_" + mode).add(ready.After)
				}
				k := scene + "_wait_" + mode
				m(k).add(time.Since(t0))
				m(k + "_screenshots_count").add(time.Duration(counter.shots.Load()-shots) * time.Second)
				if !settled && mode != "fixed_3s" {
					m(k + "_unsettled_count").add(time.Second)
				}
			}
		}
		d.exec.noWatch, d.exec.window = false, ""
		d.cfg.Ready.NoDamage = false
	}
	if *itMeasure {
		waits("type_line", func(i int) string {
			return fmt.Sprintf("pyautogui.typewrite('echo step %d'); pyautogui.press('enter')", i)
		})
	}

	// A terminal whose cursor blinks every 400 ms: each Interval (500 ms)
	// holds a toggle of a 6×13 cell, more than MaxDamage.
	if err := d.Reset(ctx, term("legato-blink", "-bc", "-xrm", "XTerm*cursorOnTime: 400", "-xrm", "XTerm*cursorOffTime: 400")); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	waits("blinking_cursor", func(i int) string { return fmt.Sprintf("pyautogui.typewrite('x%d')", i) })
	if r := res["blinking_cursor_wait_executor_unsettled_count"]; r != nil && len(r.Seconds) > n/2 {
		t.Errorf("the executor's signal did not settle on a blinking cursor in %d of %d waits", len(r.Seconds), n)
	}
	if r := res["blinking_cursor_wait_probes_unsettled_count"]; *itMeasure && (r == nil || len(r.Seconds) < n) {
		t.Logf("the probes settled on the blinking cursor in some waits: the toggles fell outside their intervals")
	}
	if !*itMeasure {
		t.Logf("executor waits on a blinking cursor, seconds: %s (-osworld.measure measures the rest)", res["blinking_cursor_wait_executor"])
		return
	}

	// What reading the whole screen back costs in the guest, against a
	// region; and the executor's own CPU while the screen is still.
	out, err := d.sh.run(ctx, `exec python3 -I -S -c "$1"`, x11Src+frameCost)
	if err != nil || out.ReturnCode != 0 {
		t.Fatalf("frame cost: %v %+v", err, out)
	}
	var fc map[string]struct {
		Size  []int     `json:"size"`
		Bytes int       `json:"bytes"`
		Read  []float64 `json:"read"`
		Hash  []float64 `json:"hash"`
	}
	if err := json.Unmarshal([]byte(out.Output), &fc); err != nil {
		t.Fatalf("frame cost %q: %v", out.Output, err)
	}
	for name, c := range fc {
		for i := range c.Read {
			m("getimage_" + name + "_read").add(time.Duration(c.Read[i] * float64(time.Second)))
			m("getimage_" + name + "_crc32").add(time.Duration(c.Hash[i] * float64(time.Second)))
		}
	}
	cpu, err := d.sh.run(ctx, `read -r pid <"$1/pid"; t0=$(cut -d' ' -f14,15 /proc/$pid/stat); sleep 10; t1=$(cut -d' ' -f14,15 /proc/$pid/stat); echo $t0 $t1 $(getconf CLK_TCK)`, d.exec.dir)
	if err != nil || cpu.ReturnCode != 0 {
		t.Fatalf("executor cpu: %v %+v", err, cpu)
	}
	var u0, s0, u1, s1, tck float64
	if _, err := fmt.Sscan(cpu.Output, &u0, &s0, &u1, &s1, &tck); err != nil {
		t.Fatalf("executor cpu %q: %v", cpu.Output, err)
	}
	t.Logf("executor CPU over 10 s of a blinking cursor: %.1f%% of one CPU", (u1+s1-u0-s0)/tck/10*100)

	keys := slices.Sorted(maps.Keys(res))
	var b strings.Builder
	fmt.Fprintf(&b, "executor measurements on %s (accel %s: %s), seconds:\n", d.vm.Name(), d.vm.Accel(), accelWords(d.vm.Accel()))
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-52s %s\n", k, res[k])
	}
	t.Log(b.String())
	if *itMeasureOut != "" {
		data, err := json.MarshalIndent(map[string]any{"accel": d.vm.Accel(), "results": res}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*itMeasureOut, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// debugOnly passes Info records and up, and the Debug records of one
// message.
type debugOnly struct {
	slog.Handler
	msg string
}

func (h debugOnly) Enabled(context.Context, slog.Level) bool { return true }

func (h debugOnly) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo && r.Message != h.msg {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h debugOnly) WithAttrs(as []slog.Attr) slog.Handler {
	return debugOnly{h.Handler.WithAttrs(as), h.msg}
}

func (h debugOnly) WithGroup(name string) slog.Handler {
	return debugOnly{h.Handler.WithGroup(name), h.msg}
}

// measureReps is n with -osworld.measure and 0 without: a loop that only
// measures runs under the flag.
func measureReps(n int) int {
	if *itMeasure {
		return n
	}
	return 0
}
