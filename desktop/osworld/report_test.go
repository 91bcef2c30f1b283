package osworld

import (
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
)

const gradedTaskConfig = `{
  "instruction": "Nothing to do.",
  "config": [],
  "evaluator": {
    "func": ["exact_match", "always_one"],
    "result": [{"type": "vm_command_line", "command": "echo graded", "shell": true}, {"type": "rule", "rules": null}],
    "expected": [{"type": "rule", "rules": {"expected": "graded\n"}}, null]
  }
}`

// TestDesktopsShareOneGraderPool: two desktops of a pool grade through the
// pool's grader processes (none of their own), and each says how its
// metrics ran, and what their result getters returned, until its next
// reset.
func TestDesktopsShareOneGraderPool(t *testing.T) {
	if _, err := exec.LookPath(grade.DefaultPython); err != nil {
		t.Skipf("no %s to run the fixture checkout's evaluators: %v", grade.DefaultPython, err)
	}
	g := startHostGuest(t)
	proxy := newHangProxy(t, g.URL, nil) // a second address for the same guest
	cfg := g.config(t, g.URL)
	cfg.Guests = append(cfg.Guests, GuestAddr{URL: proxy.srv.URL})
	// A relative checkout: the pool's processes run elsewhere.
	cfg.Grade = GradeConfig{OSWorldDir: "grade/testdata/osworld", Mode: grade.PreferNative, Workers: 2}
	p, err := NewPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tk := task(t, "graded", "legato_test", gradedTaskConfig)
	want := []desktop.MetricRun{
		{Metric: "exact_match", Via: grade.ViaNative, ResultGetter: "vm_command_line", ResultValue: `'graded\n'`},
		{Metric: "always_one", Via: grade.ViaPython, ResultGetter: "rule", ResultValue: "None"},
	}
	const explained = `exact_match: result getter vm_command_line returned 'graded\n'; always_one: result getter rule returned None`
	for slot := range 2 {
		d, err := p.New(t.Context(), slot)
		if err != nil {
			t.Fatal(err)
		}
		r, err := d.Evaluate(t.Context(), tk)
		if err != nil || r != 1 {
			t.Fatalf("desktop %d: Evaluate = %v, %v; want 1", slot, r, err)
		}
		rep := d.(desktop.Reporter).AttemptReport()
		if diff := cmp.Diff(want, rep.Grading, cmpopts.IgnoreFields(desktop.MetricRun{}, "Result", "Expected")); diff != "" {
			t.Errorf("desktop %d: grading (-want +got):\n%s", slot, diff)
		}
		for _, m := range rep.Grading {
			if len(m.Result) != 64 {
				t.Errorf("desktop %d: %s's result digest %q, want one", slot, m.Metric, m.Result)
			}
		}
		if got := d.(desktop.GradeExplainer).ExplainGrade(); got != explained {
			t.Errorf("desktop %d: ExplainGrade = %q, want %q", slot, got, explained)
		}
		if err := d.Reset(t.Context(), tk); err != nil {
			t.Fatal(err)
		}
		rep = d.(desktop.Reporter).AttemptReport()
		if rep.Grading != nil || rep.Reset != string(ResetFast) || rep.ResetWhy != "a guest given by URL has no snapshot" || rep.Golden != "" {
			t.Errorf("desktop %d: report after a reset = %+v, want the fast reset, why, no grading and no golden key", slot, rep)
		}
	}
	if st := p.Graders().Stats(); st.Workers != 2 || st.Starts > 2 {
		t.Errorf("grader pool %+v: want 2 workers and no other process", st)
	}
}
