package osworld

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

// gradeAgainTask is a task whose grader disagrees with itself. Its first
// metric runs a counter in the guest's directory dir and finds "yes" on
// odd counts, "no" on even ones; its second compares what the postconfig
// step printed, which the grader saves on the host, with what it printed.
// The step also appends a line to gradeAgainLog(dir) each time it runs.
func gradeAgainTask(t *testing.T, dir string) desktop.Task {
	t.Helper()
	gold := filepath.Join(t.TempDir(), "printed.txt")
	if err := os.WriteFile(gold, []byte("printed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	counter := path.Join(dir, "legato-grades")
	count := fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s; if [ $((n %% 2)) = 1 ]; then echo yes; else echo no; fi`, counter)
	post := fmt.Sprintf("echo ran >> %s; echo printed", gradeAgainLog(dir))
	return task(t, "legato-grade-again", "legato_test", fmt.Sprintf(`{
	  "instruction": "Nothing to do.",
	  "config": [],
	  "evaluator": {
	    "postconfig": [{"type": "execute", "parameters": {"command": %q, "shell": true, "stdout": "printed.txt"}}],
	    "func": ["check_include_exclude", "compare_text_file"],
	    "result": [{"type": "vm_command_line", "shell": true, "command": %q}, {"type": "cache_file", "path": "printed.txt"}],
	    "expected": [{"type": "rule", "rules": {"include": ["yes"], "exclude": []}}, {"type": "rule", "rules": %q}]
	  }
	}`, post, count, gold))
}

// gradeAgainLog is the guest file gradeAgainTask's postconfig step appends
// to.
func gradeAgainLog(dir string) string { return path.Join(dir, "legato-postconfig.log") }

// checkEvaluateAgain resets d to gradeAgainTask(dir) and grades its end
// state three times: Evaluate finds yes (1), EvaluateAgain no (0), then
// yes again with the postconfig's output still there (1). The postconfig
// ran once (sh runs a shell line in the guest), and the attempt report
// keeps how the first grade's metrics ran (the second stopped at its
// first).
func checkEvaluateAgain(t *testing.T, d *Desktop, dir string, sh func(string) string) {
	t.Helper()
	ctx := t.Context()
	tk := gradeAgainTask(t, dir)
	if err := d.Reset(ctx, tk); err != nil {
		t.Fatal(err)
	}
	var r desktop.Regrader = d
	var got []float64
	first, err := d.Evaluate(ctx, tk)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, first)
	grading := d.AttemptReport().Grading
	if len(grading) != 2 {
		t.Errorf("the first grade ran %+v; want both metrics", grading)
	}
	for i := range 2 {
		s, err := r.EvaluateAgain(ctx, tk)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
		if diff := cmp.Diff(grading, d.AttemptReport().Grading); diff != "" {
			t.Errorf("the attempt report's grading after EvaluateAgain #%d (-first grade +now):\n%s", i+1, diff)
		}
	}
	if diff := cmp.Diff([]float64{1, 0, 1}, got); diff != "" {
		t.Errorf("Evaluate, EvaluateAgain, EvaluateAgain (-want +got):\n%s", diff)
	}
	runs, err := strconv.Atoi(strings.TrimSpace(sh("wc -l < " + gradeAgainLog(dir))))
	if err != nil || runs != 1 {
		t.Errorf("the postconfig step ran %d times (%v); want once", runs, err)
	}
}

// TestEvaluateAgain grades an attempt on the host guest again: the getters
// run again, the postconfig does not.
func TestEvaluateAgain(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	cfg.NoExecutor = true // nothing acts
	d := g.desktop(t, cfg)
	checkEvaluateAgain(t, d, g.Tmp(), func(cmd string) string { return g.sh(t, cmd) })
}
