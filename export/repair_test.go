package export_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/export"
	"legato/rl/schema"
)

// withDuplicateFinal copies the fixed run and appends, as line 12, a second
// final record of attempt 0 of group a (line 2, r-a0) with another reward:
// what two collects writing one file, or an edit, leaves. Taking both
// would give group a three rewards and every attempt a wrong advantage.
func withDuplicateFinal(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	dup := strings.Replace(lines[1], `"rollout_id":"r-a0"`, `"rollout_id":"r-a0-again"`, 1)
	dup = strings.Replace(dup, `"reward":1`, `"reward":0.25`, 1)
	if err := os.WriteFile(path, append(data, dup...), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

// repairRun runs schema's repair, as `legato rl repair` does.
func repairRun(t *testing.T, dir string) schema.RepairStats {
	t.Helper()
	run, err := schema.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := run.Repair()
	if cerr := run.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("Repair: %v", err)
	}
	return st
}

// TestExportRefusesDuplicateFinal: export reads by collect's rule, so a
// second final record of an attempt fails it, naming the attempt and both
// lines, and advising the repair; after the repair, which keeps the first
// record, the export is that of the run before the duplicate.
func TestExportRefusesDuplicateFinal(t *testing.T) {
	dir := withDuplicateFinal(t)
	out := filepath.Join(t.TempDir(), "train.jsonl")
	_, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
	var dup *schema.DuplicateFinalError
	if !errors.As(err, &dup) || dup.FirstLine != 2 || dup.Line != 12 || dup.GroupID != "v7/task-a" || dup.Attempt != 0 {
		t.Fatalf("ExportSteps = %v, want a DuplicateFinalError for attempt 0 of v7/task-a at lines 2 and 12", err)
	}
	if !strings.Contains(err.Error(), "legato rl repair "+dir) {
		t.Errorf("error %q does not say to run legato rl repair", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused export wrote %s", out)
	}

	st := repairRun(t, dir)
	if st.Duplicates != 1 || st.Unreadable != 0 || st.Moved() != 1 || st.Lines[0].Line != 12 {
		t.Fatalf("Repair = %+v, want line 12 moved as a duplicate", st)
	}
	if _, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}); err != nil {
		t.Fatalf("ExportSteps after repair: %v", err)
	}
	want := filepath.Join(t.TempDir(), "want.jsonl")
	if _, err := export.ExportSteps(fixedRun, want, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}); err != nil {
		t.Fatal(err)
	}
	if got, want := readSamples(t, out), readSamples(t, want); len(got) != len(want) || got[0].Advantage != want[0].Advantage {
		t.Errorf("export after repair: %d samples, want %d with the fixed run's advantages", len(got), len(want))
	}
}

// TestExportAfterRepairOfDamage: a damaged mid-file line blocks export with
// advice to repair; the repair moves it to the quarantine file, with its
// line number and its bytes, and export works.
func TestExportAfterRepairOfDamage(t *testing.T) {
	dir := damagedCopy(t, 6)
	out := filepath.Join(t.TempDir(), "train.jsonl")
	_, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
	if !errors.Is(err, export.ErrDamagedRecords) || !strings.Contains(err.Error(), "legato rl repair "+dir) {
		t.Fatalf("ExportSteps = %v, want ErrDamagedRecords advising legato rl repair", err)
	}
	damaged, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	line6 := strings.SplitAfter(string(damaged), "\n")[5]

	st := repairRun(t, dir)
	if st.Unreadable != 1 || st.Moved() != 1 || st.Lines[0].Line != 6 || st.Lines[0].Text+"\n" != line6 {
		t.Fatalf("Repair = %+v, want line 6 moved with its text", st)
	}
	q, err := os.ReadFile(filepath.Join(dir, schema.QuarantineFile))
	if err != nil || !strings.Contains(string(q), `"line":6`) {
		t.Fatalf("quarantine file = %q, %v; want line 6 in it", q, err)
	}
	if _, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}); err != nil {
		t.Fatalf("ExportSteps after repair: %v", err)
	}
	if st := repairRun(t, dir); st.Moved() != 0 {
		t.Errorf("a second repair moved %+v, want nothing", st)
	}
}
