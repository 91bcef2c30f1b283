package grade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

// newBridgeGrader returns a grader on the fixture checkout that prefers the
// bridge, reading guest (if any) natively and through the bridge alike.
func newBridgeGrader(t testing.TB, guest *fakeGuest, cfg GraderConfig) *Grader {
	t.Helper()
	cfg.Python = needPython(t)
	cfg.OSWorldDir = fixtureDir(t)
	if guest != nil {
		cfg.Env.ServerPort = guest.port()
		if cfg.Guest == nil {
			cfg.Guest = guest.client(t)
		}
	}
	return newNativeGrader(t, cfg)
}

func evaluator(t testing.TB, v map[string]any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rule(v any) map[string]any { return map[string]any{"type": "rule", "rules": v} }

func TestBridgeRunsTheCheckoutsEvaluators(t *testing.T) {
	guest := newFakeGuest(t)
	guest.setFile("/home/user/notes.txt", "hello\r\nlegato\n")
	guest.setCommand("echo 1", true, "1\n")
	gold := writeTemp(t, "gold.txt", "hello\nlegato\n")
	g := newBridgeGrader(t, guest, GraderConfig{})

	tests := []struct {
		name string
		eval map[string]any
		want float64
	}{
		{"rule getters and exact_match", map[string]any{
			"func": "exact_match", "result": rule("a"), "expected": rule(map[string]any{"expected": "a"})}, 1},
		{"a metric reaching another through its package", map[string]any{
			"func": "uses_package_attribute", "result": rule("a"), "expected": rule(map[string]any{"expected": "a"})}, 1},
		{"a metric defined in __init__.py", map[string]any{
			"func": "always_one", "result": rule(nil)}, 1},
		{"vm_file through the controller", map[string]any{
			"func":     "compare_text_file",
			"result":   map[string]any{"type": "vm_file", "path": "/home/user/notes.txt", "dest": "notes.txt"},
			"expected": rule(gold)}, 1},
		{"vm_command_line to the guest server", map[string]any{
			"func":     "exact_match",
			"result":   map[string]any{"type": "vm_command_line", "command": "echo 1", "shell": true},
			"expected": rule(map[string]any{"expected": "1\n"})}, 1},
		{"and list through the bridge", map[string]any{
			"func":     []string{"exact_match", "exact_match"},
			"result":   []any{rule("a"), rule("b")},
			"expected": []any{rule(map[string]any{"expected": "a"}), rule(map[string]any{"expected": "c"})}}, 0},
		{"or list through the bridge", map[string]any{
			"func":     []string{"exact_match", "exact_match"},
			"conj":     "or",
			"result":   []any{rule("a"), rule("b")},
			"expected": []any{rule(map[string]any{"expected": "c"}), rule(map[string]any{"expected": "b"})}}, 1},
		{"result getter raising FileNotFoundError scores 0", map[string]any{
			"func": "always_one", "result": map[string]any{"type": "no_such_file"}}, 0},
		{"print() on stdout does not break the protocol", map[string]any{
			"func": "noisy_exact_match", "result": rule("a"), "expected": rule(map[string]any{"expected": "a"})}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Grade(context.Background(), desktop.Task{ID: "b1", Evaluator: evaluator(t, tt.eval)}, desktop.DoneAction)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Grade = %v, want %v", got, tt.want)
			}
		})
	}
	if n := g.pool.Stats().Starts; n != 1 {
		t.Errorf("bridge started %d times for %d grades, want once", n, len(tests))
	}
}

func TestBridgeBuildsTheEnvObject(t *testing.T) {
	guest := newFakeGuest(t)
	guest.platform = "GuestOS"
	for _, platform := range []string{"Linux", ""} {
		t.Run(fmt.Sprintf("platform %q", platform), func(t *testing.T) {
			cfg := GraderConfig{Env: Env{ChromiumPort: 9333, VLCPort: 8181, Platform: platform}}
			g := newBridgeGrader(t, guest, cfg)
			wantPlatform := platform
			if platform == "" {
				wantPlatform = "GuestOS" // asked from the guest, as OSWorld does
			}
			want := map[string]any{
				"vm_ip":         "127.0.0.1",
				"server_port":   guest.port(),
				"chromium_port": 9333,
				"vlc_port":      8181,
				"cache_dir":     filepath.Join(g.root, "tasks", "env-task"),
				"vm_platform":   wantPlatform,
				"controller":    []string{"execute_python_command", "get_accessibility_tree", "get_file", "get_terminal_output"},
			}
			task := desktop.Task{ID: "env-task", Evaluator: evaluator(t, map[string]any{
				"func": "value_equals", "result": map[string]any{"type": "env_probe"}, "expected": rule(want)})}
			got, err := g.Grade(context.Background(), task, desktop.DoneAction)
			if err != nil || got != 1 {
				t.Errorf("Grade = %v, %v; want 1 (the env object matches %v)", got, err, want)
			}
		})
	}
}

func TestBridgePassesOptions(t *testing.T) {
	g := newBridgeGrader(t, nil, GraderConfig{})
	options := map[string]any{"ignore_case": true, "n": 2, "x": 2.5, "nested": map[string]any{"a": []any{1, "b", nil}}}
	tests := []struct {
		name     string
		options  any
		expected any
		want     float64
	}{
		{"exactly the options", options, options, 1},
		{"other options", map[string]any{"ignore_case": false}, options, 0},
		{"no options", nil, map[string]any{}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eval := map[string]any{"func": "options_match", "result": rule(nil), "expected": rule(tt.expected)}
			if tt.options != nil {
				eval["options"] = tt.options
			}
			got, err := g.Grade(context.Background(), desktop.Task{ID: "opts", Evaluator: evaluator(t, eval)}, desktop.DoneAction)
			if err != nil || got != tt.want {
				t.Errorf("Grade = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestBridgeFaultsAreReportedAndTheNextGradeWorks(t *testing.T) {
	ok := desktop.Task{ID: "ok", Evaluator: evaluator(t, map[string]any{
		"func": "exact_match", "result": rule("a"), "expected": rule(map[string]any{"expected": "a"})})}
	tests := []struct {
		name       string
		metric     string
		wantIs     error
		wantType   string // PythonError type
		wantInErr  []string
		wantStarts int // processes started once the next grade succeeded
	}{
		{"metric raises", "raise_value_error", nil, "ValueError", []string{`metric raise_value_error (#0): metric`, "metric exploded", "faults.py"}, 1},
		// A worker that hangs or dies is replaced and the grade tried once
		// more, on a third process; the next grade runs there.
		{"metric hangs", "sleep_forever", ErrTimeout, "", []string{"metric sleep_forever", "killed the grader process", "second try"}, 3},
		{"metric kills its process", "exit_process", ErrBridgeExited, "", []string{"metric exit_process", "exit status 3", "leaving with status 3", "second try"}, 3},
		{"metric returns None", "return_none", nil, "", []string{"metric return_none", "not a number"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newBridgeGrader(t, nil, GraderConfig{})
			// Warm up with the default timeout, so that the short one below
			// times the metric out, not a slow start on a busy machine.
			if _, err := g.Grade(context.Background(), ok, desktop.DoneAction); err != nil {
				t.Fatal(err)
			}
			task := desktop.Task{ID: "fault", Evaluator: evaluator(t, map[string]any{"func": tt.metric, "result": rule("x")})}
			g.timeout = 2 * time.Second
			_, err := g.Grade(context.Background(), task, desktop.DoneAction)
			g.timeout = DefaultTimeout
			var ge *Error
			if !errors.As(err, &ge) || ge.Metric != tt.metric {
				t.Fatalf("Grade error = %v, want an *Error naming %s", err, tt.metric)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Grade error = %v, want one wrapping %v", err, tt.wantIs)
			}
			if tt.wantType != "" {
				var pe *PythonError
				if !errors.As(err, &pe) || pe.Type != tt.wantType || !strings.Contains(pe.Traceback, "Traceback") {
					t.Errorf("Grade error = %v, want a %s with its traceback", err, tt.wantType)
				}
			}
			for _, s := range tt.wantInErr {
				if !strings.Contains(err.Error()+traceback(err), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if !desktop.IsFailure(context.Background(), err) {
				t.Errorf("IsFailure = false for %v; a failed grader is an env failure", err)
			}
			got, err := g.Grade(context.Background(), ok, desktop.DoneAction)
			if err != nil || got != 1 {
				t.Fatalf("next Grade = %v, %v; want 1", got, err)
			}
			if n := g.pool.Stats().Starts; n != tt.wantStarts {
				t.Errorf("bridge started %d times, want %d", n, tt.wantStarts)
			}
		})
	}
}

func traceback(err error) string {
	var pe *PythonError
	if errors.As(err, &pe) {
		return pe.Traceback
	}
	return ""
}

func TestBridgeUnreachableGuestFailsTheGrade(t *testing.T) {
	python := needPython(t)
	port := closedPort(t)
	task := desktop.Task{ID: "gone", Evaluator: evaluator(t, map[string]any{
		"func":     "compare_text_file",
		"result":   map[string]any{"type": "vm_file", "path": "/x.txt", "dest": "x.txt"},
		"expected": rule("/nonexistent")})}
	for _, mode := range []Mode{PreferBridge, NativeOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			g := newNativeGrader(t, GraderConfig{
				OSWorldDir: fixtureDir(t), Mode: mode, Python: python,
				Env:   Env{ServerPort: port},
				Guest: clientFor(t, fmt.Sprintf("http://127.0.0.1:%d", port)),
			})
			got, err := g.Grade(context.Background(), task, desktop.DoneAction)
			if err == nil {
				t.Fatalf("Grade = %v with the guest unreachable, want an error", got)
			}
			if !desktop.IsFailure(context.Background(), err) {
				t.Errorf("IsFailure = false for %v", err)
			}
		})
	}
}

func TestBridgeCloseKillsAHungGrade(t *testing.T) {
	guest := newFakeGuest(t)
	g := newBridgeGrader(t, guest, GraderConfig{Timeout: time.Hour})
	task := desktop.Task{ID: "hang", Evaluator: evaluator(t, map[string]any{
		"func": "sleep_forever", "result": map[string]any{"type": "signal_guest", "signal": "/signal/started"}})}
	errc := make(chan error, 1)
	go func() {
		_, err := g.Grade(context.Background(), task, desktop.DoneAction)
		errc <- err
	}()
	<-guest.signals // the metric's getter has run: Python is busy grading
	pid := int(g.pool.workers[0].pid.Load())
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("hung Grade returned %v after Close, want ErrClosed", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("bridge process %d still exists after Close (kill -0: %v)", pid, err)
	}
	if _, err := g.Grade(context.Background(), task, desktop.DoneAction); !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Grade after Close = %v, want ErrClosed", err)
	}
	if err := g.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

func TestBridgeCancelledGrade(t *testing.T) {
	guest := newFakeGuest(t)
	g := newBridgeGrader(t, guest, GraderConfig{Timeout: time.Hour})
	hang := desktop.Task{ID: "hang", Evaluator: evaluator(t, map[string]any{
		"func": "sleep_forever", "result": map[string]any{"type": "signal_guest", "signal": "/signal/started"}})}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := g.Grade(ctx, hang, desktop.DoneAction)
		errc <- err
	}()
	<-guest.signals
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Grade = %v, want context.Canceled", err)
	}
	if desktop.IsFailure(ctx, err) {
		t.Errorf("IsFailure = true for a grade the caller cancelled")
	}
	ok := desktop.Task{ID: "ok", Evaluator: evaluator(t, map[string]any{"func": "always_one", "result": rule(nil)})}
	if got, err := g.Grade(context.Background(), ok, desktop.DoneAction); err != nil || got != 1 {
		t.Errorf("Grade after a cancelled one = %v, %v; want 1", got, err)
	}
}

func TestLoadCatalogListsTheCheckout(t *testing.T) {
	cat, err := LoadCatalog(context.Background(), GraderConfig{OSWorldDir: fixtureDir(t), CacheDir: t.TempDir(), Python: needPython(t)})
	if err != nil {
		t.Fatal(err)
	}
	if cat.Checkout() != fixtureDir(t) {
		t.Errorf("Checkout = %q, want %q", cat.Checkout(), fixtureDir(t))
	}
	task := func(id, metric, getter string) desktop.Task {
		return desktop.Task{ID: id, Evaluator: evaluator(t, map[string]any{"func": metric, "result": map[string]any{"type": getter}})}
	}
	tests := []struct {
		task    desktop.Task
		wantErr []string // "" parts: none
	}{
		{task("t-ok", "exact_match", "rule"), nil},
		{task("t-probe", "value_equals", "env_probe"), nil},
		{task("t-broken", "needs_missing_dependency", "rule"), []string{"t-broken", `metric "needs_missing_dependency"`, "legato_fixture_module_that_does_not_exist"}},
		{task("t-absent", "compare_csv", "rule"), []string{"t-absent", `metric "compare_csv"`, `has no metric "compare_csv"`}},
		{task("t-getter", "exact_match", "default_search_engine"), []string{"t-getter", `getter "default_search_engine"`}},
	}
	for _, tt := range tests {
		t.Run(tt.task.ID, func(t *testing.T) {
			err := cat.Check(tt.task)
			if tt.wantErr == nil {
				if err != nil {
					t.Errorf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, desktop.ErrUnsupported) {
				t.Fatalf("Check = %v, want an error wrapping ErrUnsupported", err)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Check error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestPlanChoosesWhereMetricsRun(t *testing.T) {
	checkout := map[string]string{"exact_match": "", "compare_csv": "", "diff_text_file": "importing desktop_env.evaluators.metrics.general: ModuleNotFoundError: No module named 'lxml'"}
	getters := map[string]string{"rule": "", "vm_file": ""}
	ev, err := ParseEvaluator(json.RawMessage(`{"func":["exact_match","compare_csv","diff_text_file"],
		"result":[{"type":"rule"},{"type":"vm_file"},{"type":"vm_file"}],
		"expected":[{"type":"rule"},{"type":"rule"},{"type":"rule"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mode Mode
		want []string
	}{
		{PreferBridge, []string{"bridge", "bridge", "native"}},
		{PreferNative, []string{"native", "bridge", "native"}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			c := &Catalog{mode: tt.mode, checkout: "/osworld", metrics: checkout, getters: getters}
			runners, err := c.plan("t", ev, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range runners {
				got = append(got, r.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
	c := &Catalog{mode: NativeOnly, checkout: "/osworld", metrics: checkout, getters: getters}
	if _, err := c.plan("t", ev, nil); err == nil || !strings.Contains(err.Error(), "compare_csv") {
		t.Errorf("native-only plan error = %v, want compare_csv refused", err)
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{PreferBridge, PreferNative, NativeOnly} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	if _, err := ParseMode("python"); err == nil {
		t.Error("ParseMode(python) succeeded, want an error")
	}
}

// TestBridgeWorkerEnvironment: the Python worker runs with what a Python
// program needs of legato's environment, never the model key nor anything
// else the user exported (read from the live worker's /proc/PID/environ).
func TestBridgeWorkerEnvironment(t *testing.T) {
	t.Setenv("LEGATO_POLICY_KEY", "sk-legato-test-key")
	t.Setenv("SOME_SECRET_TOKEN", "tok-legato-test")
	t.Setenv("HF_TOKEN", "hf_legatotesttoken")
	t.Setenv("HF_HOME", "/nonexistent/hf")
	t.Setenv("PYTHONDONTWRITEBYTECODE", "1")
	guest := newFakeGuest(t)
	g := newBridgeGrader(t, guest, GraderConfig{Timeout: time.Hour})
	task := desktop.Task{ID: "hang", Evaluator: evaluator(t, map[string]any{
		"func": "sleep_forever", "result": map[string]any{"type": "signal_guest", "signal": "/signal/started"}})}
	errc := make(chan error, 1)
	go func() {
		_, err := g.Grade(context.Background(), task, desktop.DoneAction)
		errc <- err
	}()
	<-guest.signals // the worker runs
	pid := int(g.pool.workers[0].pid.Load())
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(raw), "\x00")
	for _, kv := range env {
		if strings.Contains(kv, "sk-legato-test-key") || strings.HasPrefix(kv, "SOME_SECRET_TOKEN=") || strings.Contains(kv, "hf_legatotesttoken") {
			t.Errorf("the grader's worker has %q in its environment", kv)
		}
	}
	if !slices.Contains(env, "PYTHONDONTWRITEBYTECODE=1") || !slices.Contains(env, "PYTHONIOENCODING=utf-8") || !slices.Contains(env, "HF_HOME=/nonexistent/hf") {
		t.Errorf("the worker's environment %q lacks the Python variables it needs", env)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	<-errc
}
