package grade

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

func checkTasks(t *testing.T) []desktop.Task {
	mk := func(id string, ev map[string]any) desktop.Task {
		return desktop.Task{ID: id, Evaluator: evaluator(t, ev)}
	}
	return []desktop.Task{
		mk("both", map[string]any{"func": []string{"exact_match", "always_one"},
			"result": []any{rule("a"), rule(nil)}, "expected": []any{rule(map[string]any{"expected": "a"}), nil}}),
		mk("missing-module", map[string]any{"func": "needs_missing_dependency", "result": rule(1), "expected": rule(1)}),
		mk("nowhere", map[string]any{"func": "compare_csv", "result": rule(1), "expected": rule(1)}),
		mk("infeasible", map[string]any{"func": "infeasible"}),
		{ID: "broken", Evaluator: json.RawMessage(`{"func": 3}`)},
	}
}

func TestCheckSaysWhatGradesWhere(t *testing.T) {
	python := needPython(t)
	tests := []struct {
		name        string
		cfg         CheckConfig
		wantTasks   []TaskReport // Refused compared by substring
		wantMetrics map[string]NameReport
	}{
		{
			name: "checkout, OSWorld's Python first",
			cfg:  CheckConfig{OSWorldDir: fixtureDir(t), Python: python, BytecodeDir: t.TempDir()},
			wantTasks: []TaskReport{
				{ID: "both", Metrics: []desktop.MetricRun{{Metric: "exact_match", Via: ViaPython}, {Metric: "always_one", Via: ViaPython}}},
				{ID: "missing-module", Refused: `metric "needs_missing_dependency": not implemented natively; the OSWorld checkout fails to import it`},
				{ID: "nowhere", Refused: `metric "compare_csv": not implemented natively; the OSWorld checkout has no metric "compare_csv"`},
				{ID: "infeasible"},
				{ID: "broken", Refused: "task broken: evaluator func"},
			},
			wantMetrics: map[string]NameReport{
				"exact_match": {Name: "exact_match", Native: true, InCheckout: true, Imports: true, Via: ViaPython},
				"needs_missing_dependency": {Name: "needs_missing_dependency", InCheckout: true,
					Missing: "legato_fixture_module_that_does_not_exist", Via: ""},
				"always_one": {Name: "always_one", InCheckout: true, Imports: true, Via: ViaPython},
			},
		},
		{
			name: "checkout, native first",
			cfg:  CheckConfig{OSWorldDir: fixtureDir(t), Python: python, Mode: PreferNative, BytecodeDir: t.TempDir()},
			wantTasks: []TaskReport{
				{ID: "both", Metrics: []desktop.MetricRun{{Metric: "exact_match", Via: ViaNative}, {Metric: "always_one", Via: ViaPython}}},
				{ID: "missing-module", Refused: "needs_missing_dependency"},
				{ID: "nowhere", Refused: "compare_csv"},
				{ID: "infeasible"},
				{ID: "broken", Refused: "evaluator func"},
			},
			wantMetrics: map[string]NameReport{
				"exact_match": {Name: "exact_match", Native: true, InCheckout: true, Imports: true, Via: ViaNative},
			},
		},
		{
			name: "no checkout",
			cfg:  CheckConfig{Mode: NativeOnly},
			wantTasks: []TaskReport{
				{ID: "both", Refused: `metric "always_one": not implemented natively; native-only grading`},
				{ID: "missing-module", Refused: "needs_missing_dependency"},
				{ID: "nowhere", Refused: "compare_csv"},
				{ID: "infeasible"},
				{ID: "broken", Refused: "evaluator func"},
			},
			wantMetrics: map[string]NameReport{
				"exact_match": {Name: "exact_match", Native: true, Via: ViaNative},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Tasks = checkTasks(t)
			rep, err := Check(context.Background(), tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Tasks) != len(tt.wantTasks) {
				t.Fatalf("%d task reports, want %d", len(rep.Tasks), len(tt.wantTasks))
			}
			for i, want := range tt.wantTasks {
				got := rep.Tasks[i]
				if want.Refused == "" && got.Refused != "" || !strings.Contains(got.Refused, want.Refused) {
					t.Errorf("task %s refused %q, want %q", got.ID, got.Refused, want.Refused)
				}
				if diff := cmp.Diff(want.Metrics, got.Metrics); diff != "" {
					t.Errorf("task %s metrics (-want +got):\n%s", got.ID, diff)
				}
			}
			byName := map[string]NameReport{}
			for _, m := range rep.Metrics {
				byName[m.Name] = m
			}
			for name, want := range tt.wantMetrics {
				got := byName[name]
				got.Reason = "" // Python's wording
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("metric %s (-want +got):\n%s", name, diff)
				}
			}
			if n := len(rep.Refused()); n != 3+boolInt(tt.cfg.Mode == NativeOnly) {
				t.Errorf("%d refused tasks", n)
			}
			var text strings.Builder
			if err := rep.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if tt.cfg.OSWorldDir != "" {
				for _, s := range []string{"python:", rep.Python.Executable, "missing Python modules: legato_fixture_module_that_does_not_exist (1)", "memory:"} {
					if !strings.Contains(text.String(), s) {
						t.Errorf("report does not say %q:\n%s", s, text.String())
					}
				}
				if rep.Python.Version == "" || rep.WorkerRSS <= 0 {
					t.Errorf("interpreter %+v, worker RSS %d: want both known", rep.Python, rep.WorkerRSS)
				}
			}
			if !strings.Contains(text.String(), "would be refused") {
				t.Errorf("report does not list refusals:\n%s", text.String())
			}
		})
	}
}

func TestCheckRefusesAMissingInterpreter(t *testing.T) {
	_, err := Check(context.Background(), CheckConfig{OSWorldDir: fixtureDir(t), Python: "legato-no-such-python"})
	if err == nil || !strings.Contains(err.Error(), "legato-no-such-python") {
		t.Errorf("Check = %v, want an error naming the interpreter", err)
	}
}
