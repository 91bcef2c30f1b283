package grade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"legato/rl/desktop"
)

// outcome is what grading gave: a score, or the exception raised.
type outcome struct {
	Score float64
	Raise string
}

func outcomeOf(t *testing.T, s float64, err error) outcome {
	t.Helper()
	if err == nil {
		return outcome{Score: s}
	}
	var pe *PythonError
	if errors.As(err, &pe) {
		return outcome{Raise: pe.Type}
	}
	t.Fatalf("grade failed outside the metric: %v", err)
	return outcome{}
}

// caseTask turns a metric case into a task whose getters are rules holding
// the case's values (file arguments become the files' paths).
func caseTask(t *testing.T, c metricCase) desktop.Task {
	t.Helper()
	dir := t.TempDir()
	arg := func(jsonText string, file *string, name string) string {
		if file == nil {
			return jsonText
		}
		p := filepath.Join(dir, name)
		if *file != "-" {
			if err := os.WriteFile(p, []byte(*file), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return fmt.Sprintf("%q", p)
	}
	ev := fmt.Sprintf(`{"func":%q,"result":{"type":"rule","rules":%s}`, c.metric, arg(c.result, c.resultFile, "result.txt"))
	if c.expected != "" || c.expectedFile != nil {
		ev += fmt.Sprintf(`,"expected":{"type":"rule","rules":%s}`, arg(c.expected, c.expectedFile, "expected.txt"))
	}
	if c.options != "" {
		ev += `,"options":` + c.options
	}
	return desktop.Task{ID: "diff", Evaluator: []byte(ev + "}")}
}

// differential grades every metric case natively and through checkout's
// bridge and reports where they differ.
func differential(t *testing.T, checkout string) {
	python := needPython(t)
	native := newNativeGrader(t, GraderConfig{Mode: NativeOnly})
	bridged := newNativeGrader(t, GraderConfig{OSWorldDir: checkout, Python: python})
	cat, err := bridged.loadCatalog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range metricCases {
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := cat.metrics[c.metric]; !ok || reason != "" {
				t.Skipf("%s not importable from %s: %s", c.metric, checkout, reason)
			}
			task := caseTask(t, c)
			ctx := context.Background()
			ns, nerr := native.Grade(ctx, task, desktop.DoneAction)
			bs, berr := bridged.Grade(ctx, task, desktop.DoneAction)
			if got, want := outcomeOf(t, ns, nerr), outcomeOf(t, bs, berr); got != want {
				t.Errorf("%s: native %+v (%v), bridge %+v (%v)", c.metric, got, nerr, want, berr)
			}
		})
	}
	if n := bridged.pool.Stats().Starts; n != 1 {
		t.Errorf("bridge started %d times, want once", n)
	}
}

// TestNativeMatchesBridge runs the native metrics and our Python versions of
// them (in the fixture checkout, written to OSWorld's behaviour) on the same
// inputs.
func TestNativeMatchesBridge(t *testing.T) {
	differential(t, fixtureDir(t))
}

// TestNativeMatchesOSWorld does the same against a real OSWorld checkout
// given in LEGATO_OSWORLD_DIR; metrics whose modules do not import with the
// packages installed are skipped.
func TestNativeMatchesOSWorld(t *testing.T) {
	dir := os.Getenv("LEGATO_OSWORLD_DIR")
	if dir == "" {
		t.Skip("set LEGATO_OSWORLD_DIR to an OSWorld checkout to compare with its metrics")
	}
	differential(t, dir)
}

// TestRealTasksNativeMatchesOSWorld grades real tasks through a real OSWorld
// checkout's getters and metrics (LEGATO_OSWORLD_DIR) and natively, against
// the same fake guest: OSWorld's getters must work with the env object the
// bridge builds, and give what the native ones give.
func TestRealTasksNativeMatchesOSWorld(t *testing.T) {
	dir := os.Getenv("LEGATO_OSWORLD_DIR")
	if dir == "" {
		t.Skip("set LEGATO_OSWORLD_DIR to an OSWorld checkout to compare with its getters")
	}
	python := needPython(t)
	osTask := loadTask(t, "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2")
	cmd := "pulseaudio --start\npactl list sinks | grep '^[[:space:]]Volume:' | head -n 1 | awk '{print $5}' | sed 's/%//g'"
	tests := []struct {
		name  string
		task  desktop.Task
		setup func(*fakeGuest)
	}{
		{"vm_command_line 100", osTask, func(g *fakeGuest) { g.setCommand(cmd, true, "100\n") }},
		{"vm_command_line 50", osTask, func(g *fakeGuest) { g.setCommand(cmd, true, "50\n") }},
		{"vm_command_line refused", osTask, func(g *fakeGuest) {}},
		{"vm_file and compare_text_file", desktop.Task{ID: "vmfile", Evaluator: []byte(`{"func":"compare_text_file",
			"result":{"type":"vm_file","path":"/home/user/a.txt","dest":"a.txt"},
			"expected":{"type":"vm_file","path":"/home/user/b.txt","dest":"b.txt"},"options":{"ignore_blanks":true}}`)},
			func(g *fakeGuest) { g.setFile("/home/user/a.txt", "x  y\n"); g.setFile("/home/user/b.txt", "x y") }},
		{"vm_file missing", desktop.Task{ID: "vmfile", Evaluator: []byte(`{"func":"compare_text_file",
			"result":{"type":"vm_file","path":"/home/user/none.txt","dest":"a.txt"},
			"expected":{"type":"rule","rules":"/nonexistent"}}`)}, func(g *fakeGuest) {}},
		{"vm_file multi gives", desktop.Task{ID: "multi", Evaluator: []byte(`{"func":"literal_match",
			"result":{"type":"vm_file","multi":true,"path":["/a","/b","/c"],"dest":["a","b","c"],"gives":[0,2]},
			"expected":{"type":"rule","rules":"x"}}`)}, func(g *fakeGuest) { g.setFile("/a", "1"); g.setFile("/c", "3") }},
		{"accessibility tree", desktop.Task{ID: "a11y", Evaluator: []byte(`{"func":"check_include_exclude",
			"result":{"type":"accessibility_tree"},"expected":{"type":"rule","rules":{"include":["<desktop"]}}}`)},
			func(g *fakeGuest) { g.tree = "<desktop-frame/>" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			guest := newFakeGuest(t)
			tt.setup(guest)
			var got [2]outcome
			for i, mode := range []Mode{NativeOnly, PreferBridge} {
				g := newNativeGrader(t, GraderConfig{
					OSWorldDir: dir, Python: python, Mode: mode,
					Env:   Env{ServerPort: guest.port()},
					Guest: guest.client(t),
				})
				s, err := g.Grade(context.Background(), tt.task, desktop.DoneAction)
				var ge *Error
				if errors.As(err, &ge) && ge.Op == "metric" {
					got[i] = outcomeOf(t, s, err)
					continue
				}
				if err != nil {
					t.Fatalf("%v: %v", mode, err)
				}
				got[i] = outcome{Score: s}
			}
			if got[0] != got[1] {
				t.Errorf("native %+v, OSWorld %+v", got[0], got[1])
			}
		})
	}
}
