package export_test

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/export"
	"legato/rl/schema"
)

// writeBatchRun writes a run of the records specs, in their order, with a
// batch.json of groups of size finished attempts run with attempts
// attempts each, as collect writes it.
func writeBatchRun(t *testing.T, specs []attemptSpec, size, attempts int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	run, err := schema.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	start := t0
	var taskIDs []string
	for _, a := range specs {
		rec, err := buildRecord(run, a, start)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Append(rec); err != nil {
			t.Fatal(err)
		}
		start = rec.EndedAt.Time
		if !slices.Contains(taskIDs, a.task) {
			taskIDs = append(taskIDs, a.task)
		}
	}
	if err := run.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(schema.Batch{Schema: schema.BatchVersion, Model: policy.Model, Version: policy.Version,
		Group: size, Attempts: attempts, TaskIDs: taskIDs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, schema.BatchFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// finished and failed are records of attempt n of task with two steps.
func finished(id, task string, n int, r float64) attemptSpec {
	return attemptSpec{id: id, task: task, attempt: n, status: schema.StatusOK, reward: reward(r),
		model: []float64{1, 1}, queue: []float64{0, 0}, graded: true}
}

func failed(id, task string, n int, status schema.Status) attemptSpec {
	a := attemptSpec{id: id, task: task, attempt: n, status: status, model: []float64{1}, queue: []float64{0},
		err: &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "act: guest server crashed"}}
	if status == schema.StatusRetried {
		a.model, a.queue, a.resetS = nil, nil, 6
	}
	return a
}

// stoppedRun is a batch of groups of G=4 with one oversampled attempt
// that a SIGTERM stopped:
//
//	q: q0–q3 ok 1, 0, 1, 1; q4 never ran          → closed: G finished
//	e: e0 ok 1, e2 ok 0, e1, e3, e4 errors          → ended: every attempt has its final record
//	p: p0 ok 1, p2 ok 0, p3 ok 0; p1 retried, p4 never ran → cut short
//	z: z0 ok 0.5; the rest never ran                → cut short
func stoppedRun(t *testing.T) string {
	return writeBatchRun(t, []attemptSpec{
		finished("p0", "task-p", 0, 1),
		finished("q0", "task-q", 0, 1),
		failed("p1-try0", "task-p", 1, schema.StatusRetried),
		finished("e0", "task-e", 0, 1),
		failed("e1", "task-e", 1, schema.StatusError),
		finished("q1", "task-q", 1, 0),
		finished("z0", "task-z", 0, 0.5),
		finished("p2", "task-p", 2, 0),
		finished("q2", "task-q", 2, 1),
		finished("e2", "task-e", 2, 0),
		failed("e3", "task-e", 3, schema.StatusError),
		finished("q3", "task-q", 3, 1),
		finished("p3", "task-p", 3, 0),
		failed("e4", "task-e", 4, schema.StatusError),
	}, 4, 5)
}

// advantagesOf returns each rollout's advantage in the samples at path,
// checking that a rollout's samples agree.
func advantagesOf(t *testing.T, path string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range readSamples(t, path) {
		if a, ok := out[s.RolloutID]; ok && a != s.Advantage {
			t.Errorf("%s: advantages %v and %v", s.RolloutID, a, s.Advantage)
		}
		out[s.RolloutID] = s.Advantage
	}
	return out
}

// TestExportLeavesOutGroupsCutShort: the groups of a stopped batch that
// never ended (p and z) are left out and named, with their samples
// counted; the closed group (q) and the one that ended short on errors (e)
// are written. With PartialGroups they are written too, with advantages
// over the attempts they have: p's rewards 1, 0, 0 give √2, −1/√2, −1/√2.
// An export that drops constant groups (two passes from the start) leaves
// out the same groups and writes the same bytes.
func TestExportLeavesOutGroupsCutShort(t *testing.T) {
	dir := stoppedRun(t)
	out := filepath.Join(t.TempDir(), "train.jsonl")
	st, err := export.ExportSteps(dir, out, export.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"v7/task-p", "v7/task-z"}; !slices.Equal(st.PartialGroups, want) || st.PartialLines != 8 || st.GroupSize != 4 {
		t.Errorf("partial groups %v with %d samples, group size %d; want %v with 8 samples, 4", st.PartialGroups, st.PartialLines, st.GroupSize, want)
	}
	if st.Groups != 2 || st.Rollouts != 6 || st.Lines != 12 {
		t.Errorf("wrote %d samples of %d rollouts in %d groups, want 12 of 6 in 2", st.Lines, st.Rollouts, st.Groups)
	}
	// q: rewards 1, 0, 1, 1: mean 3/4, std √3/4; e: ±1.
	q := 1 / math.Sqrt(3)
	want := map[string]float64{"q0": q, "q1": -3 * q, "q2": q, "q3": q, "e0": 1, "e2": -1}
	if diff := cmp.Diff(want, advantagesOf(t, out), cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("advantages (-want +got):\n%s", diff)
	}

	twoPasses := filepath.Join(t.TempDir(), "drop.jsonl")
	st2, err := export.ExportSteps(dir, twoPasses, export.Options{DropConstantGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(twoPasses)
	if string(a) != string(b) || !slices.Equal(st2.PartialGroups, st.PartialGroups) || st2.PartialLines != st.PartialLines || st2.DroppedGroups != 0 {
		t.Errorf("two passes: partial groups %v (%d samples), dropped %d, output equal %v; want those of one pass, none dropped",
			st2.PartialGroups, st2.PartialLines, st2.DroppedGroups, string(a) == string(b))
	}

	all := filepath.Join(t.TempDir(), "all.jsonl")
	st, err = export.ExportSteps(dir, all, export.Options{PartialGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Groups != 4 || st.Lines != 20 || len(st.PartialGroups) != 2 || st.PartialLines != 0 {
		t.Errorf("--partial-groups: %d samples in %d groups, partial %v (%d left out); want 20 in 4, both named, none left out",
			st.Lines, st.Groups, st.PartialGroups, st.PartialLines)
	}
	want["p0"], want["p2"], want["p3"], want["z0"] = math.Sqrt2, -1/math.Sqrt2, -1/math.Sqrt2, 0
	if diff := cmp.Diff(want, advantagesOf(t, all), cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("--partial-groups advantages (-want +got):\n%s", diff)
	}
}

// TestExportAfterRepairLeavesGroupOut is the repaired run: a line
// of a whole group of 4 (rewards 1, 1, 1, 0: advantages 0.577 and −1.732)
// is damaged, which export refuses; the repair moves it aside, and the
// group, 3 of 4 now, is left out rather than written with 0.707 and
// −1.414. PartialGroups writes it with those.
func TestExportAfterRepairLeavesGroupOut(t *testing.T) {
	dir := writeBatchRun(t, []attemptSpec{
		finished("r0", "task-r", 0, 1),
		finished("r1", "task-r", 1, 1),
		finished("s0", "task-s", 0, 1),
		finished("r2", "task-r", 2, 1),
		finished("s1", "task-s", 1, 0),
		finished("r3", "task-r", 3, 0),
		finished("s2", "task-s", 2, 0),
		finished("s3", "task-s", 3, 0),
	}, 4, 4)
	out := filepath.Join(t.TempDir(), "train.jsonl")
	if _, err := export.ExportSteps(dir, out, export.Options{}); err != nil {
		t.Fatal(err)
	}
	if adv := advantagesOf(t, out); math.Abs(adv["r0"]-1/math.Sqrt(3)) > 1e-12 || math.Abs(adv["r3"]+math.Sqrt(3)) > 1e-12 {
		t.Fatalf("whole group: r0 %v, r3 %v; want 0.577, −1.732", adv["r0"], adv["r3"])
	}
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[1] = lines[1][:len(lines[1])/2] + "\n" // r1
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := export.ExportSteps(dir, out, export.Options{}); !errors.Is(err, export.ErrDamagedRecords) {
		t.Fatalf("ExportSteps of the damaged run = %v, want ErrDamagedRecords", err)
	}
	if st := repairRun(t, dir); st.Unreadable != 1 {
		t.Fatalf("Repair = %+v, want the damaged line moved", st)
	}

	st, err := export.ExportSteps(dir, out, export.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.PartialGroups, []string{"v7/task-r"}) || st.PartialLines != 6 || st.Groups != 1 {
		t.Errorf("after repair: partial groups %v (%d samples), %d groups written; want v7/task-r left out (6 samples), 1 written", st.PartialGroups, st.PartialLines, st.Groups)
	}
	for id := range advantagesOf(t, out) {
		if strings.HasPrefix(id, "r") {
			t.Errorf("after repair: wrote rollout %s of the group repair cut", id)
		}
	}
	if _, err := export.ExportSteps(dir, out, export.Options{PartialGroups: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"r0": 1 / math.Sqrt2, "r2": 1 / math.Sqrt2, "r3": -math.Sqrt2, "s0": math.Sqrt(3), "s1": -1 / math.Sqrt(3), "s2": -1 / math.Sqrt(3), "s3": -1 / math.Sqrt(3)}
	if diff := cmp.Diff(want, advantagesOf(t, out), cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("after repair, --partial-groups (-want +got):\n%s", diff)
	}
}
