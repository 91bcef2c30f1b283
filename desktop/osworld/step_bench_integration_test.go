//go:build integration

package osworld

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var (
	itStepBench = flag.Bool("osworld.stepbench", false, "run the step benchmark: one group of 15-step attempts, each way of stepping side by side (tens of minutes under software emulation)")
	itStepGroup = flag.Int("osworld.stepbench.group", 6, "attempts per way in the step benchmark")
	itStepWays  = flag.String("osworld.stepbench.ways", "", "comma-separated names of the ways the step benchmark runs (default all)")
	itStepApps  = flag.String("osworld.stepbench.apps", "", "run the step benchmark on the real-apps guest instead of the test guest (a terminal), once per program named (comma-separated: "+strings.Join(slices.Sorted(maps.Keys(appsStepBenches)), ", ")+"; or all)")
	itStepOSW   = flag.Int("osworld.stepbench.osworld-group", 0, "attempts of the OSWorld-style way, whose time is mostly fixed sleeps (0: -osworld.stepbench.group)")
)

// stepBenchPlan types "echo hello legato > ~/out.txt" into the task's
// terminal a few characters per step, 14 actions, and ends the attempt at
// step 15: the same 15-step attempt every way, graded 1 when done right.
var stepBenchPlan = func() []string {
	text := "echo hello legato > ~/out.txt\n"
	var plan []string
	for i := 0; i < 14; i++ {
		lo, hi := i*len(text)/14, (i+1)*len(text)/14
		b, _ := json.Marshal(map[string]any{"action": "type", "text": text[lo:hi]})
		plan = append(plan, string(b))
	}
	return plan
}()

// appsStepBenchPlan types "Hello legato!" into the open Writer document
// of apps-writer-type a character per step, saves it, and ends the attempt
// at step 15, graded 1 when done right.
var appsStepBenchPlan = func() []string {
	var plan []string
	for _, c := range "Hello legato!" {
		b, _ := json.Marshal(map[string]any{"action": "type", "text": string(c)})
		plan = append(plan, string(b))
	}
	b, _ := json.Marshal(map[string]any{"action": "key", "keys": []string{"ctrl", "s"}})
	return append(plan, string(b))
}()

// appsStepBench is the step benchmark on one program of the real-apps
// guest: a task of tasks.json and its 15-step attempt.
type appsStepBench struct {
	task string
	plan []string
}

// appsStepBenches are the programs the step benchmark runs on the
// real-apps guest. Writer types its text a character a step; the others
// hover the pointer over the program's window (a step that changes nothing
// but what the program draws on a hover: a tooltip, a highlighted button)
// and then solve the task as the apps test does (appsPlan); each attempt
// ends at step 15, graded 1 when done right.
var appsStepBenches = map[string]appsStepBench{
	"writer":   {"apps-writer-type", appsStepBenchPlan},
	"calc":     {"apps-calc-type", hoverThen("In cell A1 of the open spreadsheet")},
	"chromium": {"apps-chrome-close-tab", hoverThen("Close the tab that is open now")},
	"gimp":     {"apps-gimp-open", hoverThen("GIMP is open")},
	"vlc":      {"apps-vlc-play", hoverThen("VLC has tone.wav open and paused")},
}

// hoverThen is 14 actions: pointer moves across the screen's middle, then
// the solution appsPlan gives the instruction.
func hoverThen(instruction string) []string {
	solve := appsPlan(instruction)
	if len(solve) == 0 {
		panic("appsPlan has no solution for " + instruction)
	}
	var plan []string
	for i := range 14 - len(solve) {
		b, _ := json.Marshal(map[string]any{"action": "mouse_move", "coordinate": []int{200 + 50*i, 300 + 25*(i%4)}})
		plan = append(plan, string(b))
	}
	return append(plan, solve...)
}

// noStep hides a desktop's Step and has its screenshots taken by the guest
// server (as before the executor took them): an action, the wait and the
// screenshot are three round trips.
type noStep struct {
	desktop.Desktop
	d *Desktop
}

func (n noStep) WaitReady(ctx context.Context, max time.Duration) (desktop.Ready, error) {
	return n.d.WaitReady(ctx, max)
}

// revertEach resets by libvirt's revert of the clean snapshot and the
// task's setup, as OSWorld resets.
type revertEach struct{ *VMDesktop }

func (r revertEach) Reset(ctx context.Context, task desktop.Task) error {
	return r.reset(ctx, task, func(resetFacts) resetPlan {
		return resetPlan{steps: []resetStep{{kind: ResetRevert, why: "OSWorld-style", setup: true}}}
	})
}

// TestIntegrationStepBench runs the same group of 15-step attempts of one
// task, a scripted model answering in 1 s, four ways on the test guest (a
// terminal), one after the other, and prints per attempt and per step the
// model's time and the rest side by side:
//
//	go test -tags integration -run TestIntegrationStepBench ./desktop/osworld/ -osworld.stepbench -timeout 0 -v
//
// The ways: legato (golden states, the executor, one round trip per step);
// three trips (the same with the executor's screenshots off: an action,
// the wait, /screenshot); no executor, no golden (`python -c` per action,
// fast reset + setup); OSWorld-style (libvirt revert + setup, `python -c`,
// fixed waits of 3 s after an action, 60 s after the reset, 20 s before
// grading).
//
// With -osworld.stepbench.apps it runs on the real-apps guest instead,
// once per program named (appsStepBenches), and ends with a table of the
// time per attempt that is not the model's, each way against legato's.
func TestIntegrationStepBench(t *testing.T) {
	if !*itStepBench {
		t.Skip("the step benchmark runs with -osworld.stepbench")
	}
	if *itStepApps == "" {
		stepBench(t, itConfig, filepath.Join("testdata", "tasks", "guest_tasks.json"), "legato-term-echo", stepBenchPlan)
		return
	}
	programs := strings.Split(*itStepApps, ",")
	if *itStepApps == "all" {
		programs = slices.Sorted(maps.Keys(appsStepBenches))
	}
	var names []string
	var rows [][]stepBenchResult
	for _, name := range programs {
		b, ok := appsStepBenches[name]
		if !ok {
			t.Fatalf("-osworld.stepbench.apps: no program %q; want some of %v, or all", name, slices.Sorted(maps.Keys(appsStepBenches)))
		}
		t.Run(name, func(t *testing.T) {
			names = append(names, name)
			rows = append(rows, stepBench(t, appsConfig, filepath.Join("testdata", "apps-tasks", "tasks.json"), b.task, b.plan))
		})
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nreal-apps guest, time per attempt that is not the model's (seconds: the median attempt's, the group's mean, per step), and each way's against legato's\n")
	fmt.Fprintf(&out, "%-10s %-26s %9s %9s %9s %9s %9s\n", "program", "way", "median", "mean", "per step", "× median", "× mean")
	for i, rs := range rows {
		var base stepBenchResult // legato's; none when its way did not run
		for _, r := range rs {
			if r.name == "legato" {
				base = r
			}
		}
		ratio := func(v, of float64) string {
			if of <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f", v/of)
		}
		for _, r := range rs {
			fmt.Fprintf(&out, "%-10s %-26s %9.1f %9.1f %9.2f %9s %9s\n", names[i], r.name, r.nonModel, r.meanNonModel, r.perStep,
				ratio(r.nonModel, base.nonModel), ratio(r.meanNonModel, base.meanNonModel))
		}
	}
	t.Log(out.String())
}

// stepBenchResult is one way's attempts in the step benchmark, and the
// medians per attempt and per step of the time that is not the model's.
type stepBenchResult struct {
	name   string
	golden bool // its attempts start from the task's golden state
	recs   []schema.Record
	// nonModel is the median attempt's, meanNonModel the group's mean
	// (with golden states, the first attempt's setup and golden state
	// shared by the group).
	nonModel, meanNonModel, perStep float64
}

// stepBench runs the benchmark's ways on one task (see
// TestIntegrationStepBench), logs its tables and returns what each way
// took.
func stepBench(t *testing.T, config func(*testing.T, string) Config, file, taskID string, plan []string) []stepBenchResult {
	type way struct {
		name  string
		cfg   func(*Config)
		wrap  func(*VMDesktop) desktop.Desktop
		fixed *desktop.FixedWaits
		// golden: every attempt starts from the task's golden state.
		golden bool
	}
	ways := []way{
		{name: "legato", golden: true, cfg: func(c *Config) { c.Golden = GoldenConfig{Max: 1} }},
		{name: "three trips", golden: true, cfg: func(c *Config) { c.Golden = GoldenConfig{Max: 1} },
			wrap: func(d *VMDesktop) desktop.Desktop { d.shots = shotsDiffer; return noStep{d, d.Desktop} }},
		{name: "no executor, no golden", cfg: func(c *Config) { c.NoExecutor = true }},
		{name: "OSWorld-style", cfg: func(c *Config) { c.NoExecutor = true },
			wrap:  func(d *VMDesktop) desktop.Desktop { return revertEach{d} },
			fixed: &desktop.FixedWaits{AfterAction: 3 * time.Second, AfterReset: 60 * time.Second, BeforeEval: 20 * time.Second}},
	}
	srv := policytest.NewServer(policytest.Options{Latency: policytest.Latency{Base: time.Second},
		Script: func(req policytest.Request) string { return planCall(req.Step, plan) }})
	defer srv.Close()

	var results []stepBenchResult
	if *itStepWays != "" {
		ways = slices.DeleteFunc(ways, func(w way) bool { return !slices.Contains(strings.Split(*itStepWays, ","), w.name) })
	}
	for _, w := range ways {
		cfg := config(t, "legato-itstep-")
		w.cfg(&cfg)
		p, tasks := itPool(t, cfg, file)
		tasks = slices.DeleteFunc(tasks, func(tk desktop.Task) bool { return tk.ID != taskID })
		factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := p.New(ctx, slot)
			if err != nil || w.wrap == nil {
				return d, err
			}
			return w.wrap(d.(*VMDesktop)), nil
		}
		group := *itStepGroup
		if w.fixed != nil {
			factory = desktop.WithFixedWaits(factory, *w.fixed)
			if *itStepOSW > 0 {
				group = *itStepOSW
			}
		}
		out := t.TempDir()
		start := time.Now()
		_, err := rl.Collect(t.Context(), tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "bench"}, rl.CollectOptions{
			Out: out, NewDesktop: factory, Desktops: 1, Group: group, MaxSteps: 15, EnvRetries: -1, Logger: cfg.Logger,
		})
		if err != nil {
			t.Fatalf("%s: Collect: %v", w.name, err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("%s: close the pool: %v", w.name, err)
		}
		r := stepBenchResult{name: w.name, golden: w.golden}
		if _, err := schema.ReadRunRecords(out, func(rec schema.Record) error {
			r.recs = append(r.recs, rec)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d attempts in %v", w.name, len(r.recs), time.Since(start).Round(time.Second))
		for _, rec := range r.recs {
			if rec.Status != schema.StatusOK || rec.Reward == nil || *rec.Reward != 1 || rec.NSteps != 15 {
				t.Errorf("%s: attempt %d: status %s, reward %v, %d steps; want ok, 1, 15", w.name, rec.Attempt, rec.Status, fmtReward(rec.Reward), rec.NSteps)
			}
		}
		results = append(results, r)
	}

	// Golden states give every attempt the same first screen, and the
	// executor's screenshots of it are the same bytes.
	for _, r := range results {
		if !r.golden {
			continue
		}
		var first []string
		for _, rec := range r.recs {
			if len(rec.Steps) > 0 {
				first = append(first, strings.Join(rec.Steps[0].Request, ","))
			}
		}
		if kinds := slices.Compact(slices.Sorted(slices.Values(first))); len(kinds) != 1 {
			t.Errorf("%s: the attempts' first prompts differ: %d kinds", r.name, len(kinds))
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nper attempt, medians of a way's attempts of 15 steps (model: 1 s a call), seconds\n")
	fmt.Fprintf(&b, "%-24s %8s %8s %9s %8s %8s %8s %8s\n", "way", "total", "model", "not model", "reset", "w.reset", "w.eval", "eval")
	for i, r := range results {
		col := func(f func(schema.Record) float64) float64 {
			var v []float64
			for _, rec := range r.recs {
				v = append(v, f(rec))
			}
			return median(v)
		}
		model := func(rec schema.Record) float64 { return rec.Timing.QueueS + rec.Timing.ModelS }
		results[i].nonModel = col(func(rec schema.Record) float64 { return rec.Timing.TotalS - model(rec) })
		for _, rec := range r.recs {
			results[i].meanNonModel += (rec.Timing.TotalS - model(rec)) / float64(len(r.recs))
		}
		fmt.Fprintf(&b, "%-24s %8.1f %8.1f %9.1f %8.1f %8.1f %8.1f %8.1f\n", r.name,
			col(func(rec schema.Record) float64 { return rec.Timing.TotalS }), col(model),
			results[i].nonModel,
			col(func(rec schema.Record) float64 { return rec.Timing.ResetS }),
			col(func(rec schema.Record) float64 { return rec.Timing.WaitAfterResetS }),
			col(func(rec schema.Record) float64 { return rec.Timing.WaitBeforeEvalS }),
			col(func(rec schema.Record) float64 { return rec.Timing.EvalS }))
	}
	fmt.Fprintf(&b, "\nper step (means over the actions), seconds\n")
	fmt.Fprintf(&b, "%-24s %9s %7s %7s %7s %8s %7s %9s\n", "way", "not model", "act", "wait", "obs", "capture", "encode", "transfer")
	for i, r := range results {
		var steps, acts, split int
		var nonModel, act, wait, obs, capture, encode, transfer float64
		for _, rec := range r.recs {
			steps += len(rec.Steps)
			nonModel += rec.Timing.TotalS - rec.Timing.QueueS - rec.Timing.ModelS
			for _, s := range rec.Steps {
				for _, a := range s.Actions {
					if a.ActS == 0 && a.WaitS == 0 && a.ObsS == 0 {
						continue
					}
					acts++
					act, wait, obs = act+a.ActS, wait+a.WaitS, obs+a.ObsS
					if a.CaptureS > 0 {
						split++
						capture, encode, transfer = capture+a.CaptureS, encode+a.EncodeS, transfer+a.TransferS
					}
				}
			}
		}
		n, m := float64(max(acts, 1)), float64(max(split, 1))
		results[i].perStep = nonModel / float64(max(steps, 1))
		fmt.Fprintf(&b, "%-24s %9.2f %7.2f %7.2f %7.2f %8.3f %7.3f %9.3f\n", r.name, results[i].perStep,
			act/n, wait/n, obs/n, capture/m, encode/m, transfer/m)
	}
	t.Log(b.String())
	return results
}

// TestIntegrationShotEncoders measures the executor's screenshot at each
// zlib level on the test guest (a 1920x1080 desktop with a terminal full of
// text): capture and encoding time in the guest, PNG size, and checks that
// every level gives the pixels of /screenshot and, taken again, the same
// bytes. It runs with -osworld.stepbench.
func TestIntegrationShotEncoders(t *testing.T) {
	if !*itStepBench {
		t.Skip("the screenshot encoders are measured with -osworld.stepbench")
	}
	cfg := itConfig(t, "legato-itshot-")
	p, tasks := itPool(t, cfg, filepath.Join("testdata", "tasks", "guest_tasks.json"))
	tasks = slices.DeleteFunc(tasks, func(tk desktop.Task) bool { return tk.ID != "legato-term-echo" })
	dd, err := p.New(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*VMDesktop).Desktop
	ctx := t.Context()
	if err := d.Reset(ctx, tasks[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.typewrite("ls -l /usr/bin /etc\n")`}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WaitReady(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	theirs, err := d.guest.Screenshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := d.guest.Screenshot(ctx); err != nil {
		t.Fatal(err)
	}
	serverShot := time.Since(t0)
	var b strings.Builder
	fmt.Fprintf(&b, "\nGET /screenshot (the guest server: xwd file, RGBA, zlib 1): %v round trip, %d bytes\n", serverShot.Round(time.Millisecond), len(theirs.PNG))
	fmt.Fprintf(&b, "%5s %9s %9s %10s %10s\n", "level", "capture", "encode", "bytes", "round trip")
	for _, level := range []int{0, 1, 2, 3, 6, 9} {
		var enc, capt, trip []float64
		var first []byte
		for i := range 3 {
			var a settleAnswer
			t0 := time.Now()
			if _, err := d.callExecutor(ctx, executorRequest{Op: "settle", Max: 1e-3, Interval: 0.3, MaxLoad: 1, MaxDamage: 1, Shot: &level}, &a); err != nil || len(a.PNG) == 0 {
				t.Fatalf("level %d: %v %q", level, err, a.ShotError)
			}
			trip = append(trip, time.Since(t0).Seconds())
			enc, capt = append(enc, a.EncodeS), append(capt, a.CaptureS)
			if i == 0 {
				first = a.PNG
				if why, err := diffPixels(a.PNG, theirs.PNG); why != "" || err != nil {
					t.Errorf("level %d: the executor's screenshot and /screenshot differ: %s %v", level, why, err)
				}
			} else if !bytes.Equal(first, a.PNG) {
				t.Errorf("level %d: the same screen gave other bytes", level)
			}
		}
		fmt.Fprintf(&b, "%5d %8.3fs %8.3fs %10d %9.3fs\n", level, median(capt), median(enc), len(first), median(trip))
	}
	t.Log(b.String())
}
