package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/desktop"
	"legato/rl/desktop/desktoptest"
	"legato/rl/desktop/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Real OSWorld tasks, copied into testdata: an infeasible one and a feasible
// one with setup steps and two metrics.
const (
	infeasibleID = "3720f614-37fd-4d04-8a6b-76f54f8c222d"
	feasibleID   = "3680a5ee-6870-426a-a997-eba929a0d25c"
)

func loadTask(t testing.TB, id, domain string) desktop.Task {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var task desktop.Task
	if err := json.Unmarshal(raw, &task); err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	task.Domain, task.Raw = domain, raw
	return task
}

func infeasibleTask(t testing.TB) desktop.Task { return loadTask(t, infeasibleID, "chrome") }
func feasibleTask(t testing.TB) desktop.Task   { return loadTask(t, feasibleID, "multi_apps") }

var codeAction = desktop.Action{Kind: desktop.Code, Code: "pyautogui.click(960, 540)"}

// phaseOf maps the suite's methods to the fake's phases, to inject a hang.
func phaseOf(m desktoptest.Method) fake.Phase {
	return map[desktoptest.Method]fake.Phase{
		desktoptest.MethodReset:          fake.PhaseReset,
		desktoptest.MethodWaitAfterReset: fake.PhaseWaitAfterReset,
		desktoptest.MethodObserve:        fake.PhaseObserve,
		desktoptest.MethodAct:            fake.PhaseAct,
		desktoptest.MethodWaitBeforeEval: fake.PhaseWaitBeforeEval,
		desktoptest.MethodEvaluate:       fake.PhaseEvaluate,
	}[m]
}

func TestConformance(t *testing.T) {
	tasks := []desktop.Task{infeasibleTask(t), feasibleTask(t), desktoptest.DefaultTask()}
	for _, tc := range []struct {
		name string
		cfg  fake.Config
		opts desktoptest.Options
	}{
		{"Default", fake.Config{}, desktoptest.Options{Width: 1920, Height: 1080}},
		{
			"SmallScreenOSWorldTasks",
			fake.Config{Width: 640, Height: 400, Seed: 7, DefaultReward: fake.Reward{P: 0.5}},
			desktoptest.Options{Width: 640, Height: 400, Tasks: tasks},
		},
		{
			// Real timers, kept short: every wait path runs.
			"Latencies",
			fake.Config{Width: 320, Height: 200, Latency: fake.Latencies{
				Reset:          fake.Latency{Fixed: time.Millisecond},
				WaitAfterReset: fake.Latency{Min: 100 * time.Microsecond, Max: time.Millisecond},
				Observe:        fake.Latency{Median: 200 * time.Microsecond, Sigma: 0.5},
				Act:            fake.Latency{Scale: 100 * time.Microsecond, Alpha: 1.5, Cap: 2 * time.Millisecond},
				Settle:         fake.Latency{Fixed: time.Millisecond},
				WaitBeforeEval: fake.Latency{Fixed: time.Millisecond},
				Evaluate:       fake.Latency{Fixed: time.Millisecond},
			}},
			desktoptest.Options{Tasks: tasks},
		},
		{"Capabilities", fake.Config{Width: 320, Height: 200, ReadyWaiter: true, Stepper: true}, desktoptest.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.Blocking = func(_ context.Context, m desktoptest.Method) (desktop.Desktop, error) {
				cfg := tc.cfg
				cfg.Faults = append(slices.Clone(cfg.Faults), fake.Fault{Phase: phaseOf(m), Kind: fake.FaultHang, Prob: 1})
				return fake.New(cfg).AsConfigured(), nil
			}
			desktoptest.Run(t, func(*testing.T) desktop.Desktop { return fake.New(tc.cfg).AsConfigured() }, opts)
		})
	}
}

// attempt runs one whole attempt and returns its reward.
func attempt(t *testing.T, d desktop.Desktop, task desktop.Task, actions ...desktop.Action) float64 {
	t.Helper()
	ctx := t.Context()
	if err := d.Reset(ctx, task); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range actions {
		if _, err := d.Observe(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Act(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.WaitBeforeEval(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := d.Evaluate(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestEvaluateOSWorldSemantics(t *testing.T) {
	infeasible, feasible := infeasibleTask(t), feasibleTask(t)
	always := fake.Config{Width: 64, Height: 64, DefaultReward: fake.Reward{P: 1}}
	for _, tc := range []struct {
		name    string
		cfg     fake.Config
		task    desktop.Task
		actions []desktop.Action
		want    float64
	}{
		{"InfeasibleFail", always, infeasible, []desktop.Action{codeAction, desktop.FailAction}, 1},
		{"InfeasibleDone", always, infeasible, []desktop.Action{codeAction, desktop.DoneAction}, 0},
		{"InfeasibleFailThenWait", always, infeasible, []desktop.Action{desktop.FailAction, desktop.WaitAction}, 0},
		{"InfeasibleNoAction", always, infeasible, nil, 0},
		{"InfeasibleIgnoresReward", fake.Config{Width: 64, Height: 64}, infeasible, []desktop.Action{desktop.FailAction}, 1},
		{"FeasibleDone", always, feasible, []desktop.Action{codeAction, desktop.DoneAction}, 1},
		{"FeasibleFail", always, feasible, []desktop.Action{codeAction, desktop.FailAction}, 0},
		{"FeasibleMaxSteps", always, feasible, []desktop.Action{codeAction, desktop.WaitAction}, 1},
		{"FeasibleZeroReward", fake.Config{Width: 64, Height: 64}, feasible, []desktop.Action{desktop.DoneAction}, 0},
		// An untouched start state does not solve a task, unless the
		// image already does: all or part of it.
		{"FeasibleNoAction", always, feasible, nil, 0},
		{"FeasibleSolvedAtStart", fake.Config{Width: 64, Height: 64, Rewards: map[string]fake.Reward{feasibleID: {AtStart: 1}}}, feasible, nil, 1},
		{"FeasiblePartlySolvedAtStart", fake.Config{Width: 64, Height: 64, Rewards: map[string]fake.Reward{feasibleID: {P: 1, AtStart: 0.5}}}, feasible, nil, 0.5},
		{"SolvedAtStartActedOn", fake.Config{Width: 64, Height: 64, Rewards: map[string]fake.Reward{feasibleID: {AtStart: 1}}}, feasible, []desktop.Action{desktop.DoneAction}, 0},
		{"FeasibleValue", fake.Config{Width: 64, Height: 64, DefaultReward: fake.Reward{P: 1, Value: 0.25}}, feasible, []desktop.Action{desktop.DoneAction}, 0.25},
		{
			"PerTaskOverridesDefault",
			fake.Config{Width: 64, Height: 64, DefaultReward: fake.Reward{P: 1}, Rewards: map[string]fake.Reward{feasibleID: {P: 1, Value: 0.5}}},
			feasible, []desktop.Action{desktop.DoneAction}, 0.5,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fake.New(tc.cfg)
			defer d.Close()
			if got := attempt(t, d, tc.task, tc.actions...); got != tc.want {
				t.Errorf("reward = %v, want %v", got, tc.want)
			}
			if why := d.ExplainGrade(); !strings.HasPrefix(why, "fake: ") || tc.actions == nil && tc.task.ID == feasibleID && !strings.Contains(why, "untouched (Reward.AtStart)") {
				t.Errorf("ExplainGrade = %q, want the rule that gave %v", why, tc.want)
			}
		})
	}
}

// rewards grades n attempts at task on d.
func rewards(t *testing.T, d desktop.Desktop, task desktop.Task, n int) []float64 {
	var rs []float64
	for range n {
		rs = append(rs, attempt(t, d, task, desktop.DoneAction))
	}
	return rs
}

func TestRewardsReproducible(t *testing.T) {
	task := feasibleTask(t)
	cfg := fake.Config{Width: 64, Height: 64, Seed: 42, DefaultReward: fake.Reward{P: 0.5}}
	a, b := fake.New(cfg), fake.New(cfg)
	cfg.Seed = 43
	c := fake.New(cfg)
	defer a.Close()
	defer b.Close()
	defer c.Close()

	ra, rb, rc := rewards(t, a, task, 64), rewards(t, b, task, 64), rewards(t, c, task, 64)
	if diff := cmp.Diff(ra, rb); diff != "" {
		t.Errorf("same seed, different rewards (-a +b):\n%s", diff)
	}
	if cmp.Equal(ra, rc) {
		t.Errorf("seeds 42 and 43 drew the same 64 rewards %v", ra)
	}
	// Other draws do not shift the rewards: a desktop with latencies and
	// a probabilistic fault elsewhere grades the same.
	cfg.Seed = 42
	cfg.Latency.Act = fake.Latency{Median: time.Microsecond, Sigma: 1}
	cfg.Faults = []fake.Fault{{Phase: fake.PhaseObserve, Kind: fake.FaultError, Prob: 0.5, Task: "other"}}
	d := fake.New(cfg)
	defer d.Close()
	if diff := cmp.Diff(ra, rewards(t, d, task, 64)); diff != "" {
		t.Errorf("latencies changed the rewards (-want +got):\n%s", diff)
	}
}

func TestRewardRate(t *testing.T) {
	task := feasibleTask(t)
	d := fake.New(fake.Config{Width: 64, Height: 64, Seed: 1, Rewards: map[string]fake.Reward{task.ID: {P: 0.3}}})
	defer d.Close()
	const n = 2000
	var sum float64
	for _, r := range rewards(t, d, task, n) {
		sum += r
	}
	// Binomial(2000, 0.3) has a standard deviation of about 0.01.
	if rate := sum / n; rate < 0.26 || rate > 0.34 {
		t.Errorf("success rate %.3f, want about 0.3", rate)
	}
}

func TestEvaluateMisuse(t *testing.T) {
	infeasible, feasible := infeasibleTask(t), feasibleTask(t)
	ctx := t.Context()
	d := fake.New(fake.Config{})
	defer d.Close()
	if _, err := d.Evaluate(ctx, feasible); !errors.Is(err, fake.ErrNoTask) {
		t.Errorf("Evaluate before Reset: %v, want ErrNoTask", err)
	}
	if _, err := d.Act(ctx, desktop.DoneAction); !errors.Is(err, fake.ErrNoTask) {
		t.Errorf("Act before Reset: %v, want ErrNoTask", err)
	}
	if err := d.Reset(ctx, infeasible); err != nil {
		t.Fatal(err)
	}
	_, err := d.Evaluate(ctx, feasible)
	var derr *desktop.Error
	if !errors.As(err, &derr) || derr.Op != string(fake.PhaseEvaluate) || derr.Desktop != "fake" {
		t.Errorf("Evaluate of another task: %v, want a *desktop.Error of op %q", err, fake.PhaseEvaluate)
	}
	if _, err := d.Act(ctx, desktop.Action{Kind: 42}); err == nil {
		t.Error("Act of an unknown kind succeeded")
	}
}

func TestStats(t *testing.T) {
	d := fake.New(fake.Config{Width: 64, Height: 64})
	attempt(t, d, feasibleTask(t), codeAction, desktop.DoneAction)
	d.Close()
	d.Close()
	if _, err := d.Observe(t.Context()); !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Observe after Close: %v, want ErrClosed", err)
	}
	want := fake.Stats{Resets: 1, WaitAfterResets: 1, Observes: 3, Acts: 2, WaitBeforeEvals: 1, Evaluates: 1, Closes: 2}
	if diff := cmp.Diff(want, d.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

func TestAsConfigured(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cfg               fake.Config
		ready             bool
		desktopIsConcrete bool
	}{
		{"None", fake.Config{}, false, true},
		{"ReadyWaiter", fake.Config{ReadyWaiter: true}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fake.New(tc.cfg)
			defer d.Close()
			v := d.AsConfigured()
			_, ready := v.(desktop.ReadyWaiter)
			_, concrete := v.(*fake.Desktop)
			got := []bool{ready, concrete}
			if diff := cmp.Diff([]bool{tc.ready, tc.desktopIsConcrete}, got); diff != "" {
				t.Errorf("[ReadyWaiter *Desktop] (-want +got):\n%s", diff)
			}
		})
	}
}

// An example of the fake grading OSWorld's infeasible task.
func ExampleNew() {
	ctx := context.Background()
	d := fake.New(fake.Config{Width: 640, Height: 400})
	defer d.Close()

	task := desktop.Task{ID: "t1", Evaluator: json.RawMessage(`{"func": "infeasible"}`)}
	for _, last := range []desktop.Action{desktop.DoneAction, desktop.FailAction} {
		_ = d.Reset(ctx, task)
		_ = d.WaitAfterReset(ctx)
		obs, _ := d.Observe(ctx)
		_, _ = d.Act(ctx, last)
		_ = d.WaitBeforeEval(ctx)
		r, _ := d.Evaluate(ctx, task)
		fmt.Println(obs.Width, obs.Height, last, r)
	}
	// Output:
	// 640 400 DONE 0
	// 640 400 FAIL 1
}

// A second grade of the same end state repeats the first, unless the task's
// grader is flaky: then, over many attempts, about half of the second
// grades of a P=0.5 reward disagree (two independent draws).
func TestEvaluateAgain(t *testing.T) {
	task := feasibleTask(t)
	for _, flaky := range []bool{false, true} {
		d := fake.New(fake.Config{Width: 64, Height: 64, Seed: 7, Rewards: map[string]fake.Reward{task.ID: {P: 0.5, Flaky: flaky}}})
		disagree := 0
		const n = 400
		for i := range n {
			ctx := desktop.WithAttempt(t.Context(), desktop.Attempt{GroupID: "g", TaskID: task.ID, Index: i})
			if err := d.Reset(ctx, task); err != nil {
				t.Fatal(err)
			}
			first, err := d.Evaluate(ctx, task)
			if err != nil {
				t.Fatal(err)
			}
			again, err := d.EvaluateAgain(ctx, task)
			if err != nil {
				t.Fatal(err)
			}
			if first != again {
				disagree++
			}
		}
		d.Close()
		switch {
		case !flaky && disagree != 0:
			t.Errorf("a steady grader disagreed with itself on %d of %d end states", disagree, n)
		case flaky && (disagree < n/4 || disagree > 3*n/4):
			// Binomial(400, 0.5): 200 ± 10.
			t.Errorf("a flaky grader disagreed with itself on %d of %d end states, want about half", disagree, n)
		}
	}
}
