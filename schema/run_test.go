package schema

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCreateMakesLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "batch-1")
	r := mustCreate(t, dir)
	if r.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", r.Dir(), dir)
	}
	for _, name := range []string{RecordsFile, MessagesDir, ImagesDir} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("after Create: %v", err)
		}
	}
}

func TestAppendRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	skipped := &Record{RolloutID: "r2", TaskID: "t", GroupID: "g", Attempt: 1, Status: StatusSkipped, Steps: []Step{}}
	want := []Record{*fullRecord("r1"), *skipped}
	for _, rec := range []*Record{fullRecord("r1"), skipped} {
		if err := r.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	if skipped.Schema != Version {
		t.Errorf("Append left Schema = %q, want it set to %q", skipped.Schema, Version)
	}
	want[1].Schema = Version
	got, st := readAll(t, dir)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ReadStats{Records: 2, Lines: 2}, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestAppendRejects(t *testing.T) {
	tests := []struct {
		name    string
		rec     *Record
		wantErr error
		wantMsg string
	}{
		{name: "nil", rec: nil, wantMsg: "nil record"},
		{name: "other schema", rec: &Record{Schema: "legato.rollout/v9"}, wantErr: ErrSchemaVersion},
		{name: "NaN reward", rec: &Record{Reward: ptr(math.NaN())}, wantMsg: "reward is not a finite number"},
		{name: "infinite timing", rec: &Record{Timing: Timing{EvalS: math.Inf(1)}}, wantMsg: "timing.eval_s is not a finite number"},
		{name: "-Inf logprob", rec: func() *Record {
			r := fullRecord("x")
			r.Steps[1].Response.Logprobs = []float64{-0.5, math.Inf(-1)}
			return r
		}(), wantMsg: "steps[1].response.logprobs[1] is not a finite number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			r := mustCreate(t, dir)
			err := r.Append(tt.rec)
			if err == nil {
				t.Fatal("Append succeeded, want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Append error = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Append error = %q, want it to contain %q", err, tt.wantMsg)
			}
			if _, st := readAll(t, dir); st.Lines != 0 {
				t.Errorf("a rejected record left %d lines in %s", st.Lines, RecordsFile)
			}
		})
	}
}

func TestCreateResumes(t *testing.T) {
	dir := t.TempDir()
	r1, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := r1.Append(fullRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	r2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.Append(fullRecord("c")); err != nil {
		t.Fatal(err)
	}
	got, _ := readAll(t, dir)
	if diff := cmp.Diff([]string{"a", "b", "c"}, ids(got)); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
}

func TestCreateCutsTornTail(t *testing.T) {
	tests := []struct {
		name string
		tail string
	}{
		{"half a record", `{"schema":"legato.rollout/v0","rollout_id":"torn","st`},
		{"whole record without newline", `{"schema":"legato.rollout/v0","rollout_id":"torn"}`},
		{"zeros", "\x00\x00\x00\x00"},
		{"long fragment", `{"schema":"legato.rollout/v0","steps":["` + strings.Repeat("x", 200<<10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			r := mustCreate(t, dir)
			if err := r.Append(fullRecord("a")); err != nil {
				t.Fatal(err)
			}
			r.Close()
			appendRaw(t, dir, tt.tail)
			if _, st := readAll(t, dir); st.TornLines != 1 || !st.TornTail {
				t.Fatalf("before Create: stats %+v, want one torn tail", st)
			}

			r = mustCreate(t, dir)
			if got, want := r.DroppedTail(), int64(len(tt.tail)); got != want {
				t.Errorf("DroppedTail() = %d, want %d", got, want)
			}
			if err := r.Append(fullRecord("b")); err != nil {
				t.Fatal(err)
			}
			got, st := readAll(t, dir)
			if diff := cmp.Diff([]string{"a", "b"}, ids(got)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
			if st.TornLines != 0 {
				t.Errorf("after Create and Append: %d torn lines, want 0", st.TornLines)
			}
		})
	}
}

func TestOpenMissingRun(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a missing run: %v, want fs.ErrNotExist", err)
	}
	if _, err := Create(""); err == nil {
		t.Error(`Create("") succeeded, want an error`)
	}
}

func TestCreateLocksDirectory(t *testing.T) {
	dir := t.TempDir()
	r1, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := Create(dir); !errors.Is(err, ErrLocked) {
		if err == nil {
			r2.Close()
		}
		t.Fatalf("second Create: %v, want ErrLocked", err)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	r3, err := Create(dir)
	if err != nil {
		t.Fatalf("Create after Close: %v", err)
	}
	r3.Close()
}

func TestCreateRemovesTempFiles(t *testing.T) {
	dir := t.TempDir()
	mustCreate(t, dir).Close()
	for _, d := range []string{dir, filepath.Join(dir, MessagesDir), filepath.Join(dir, ImagesDir)} {
		if err := os.WriteFile(filepath.Join(d, tempPrefix+"123"), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(t, dir)
	for _, d := range []string{dir, filepath.Join(dir, MessagesDir), filepath.Join(dir, ImagesDir)} {
		for _, name := range names(t, d) {
			if strings.HasPrefix(name, tempPrefix) {
				t.Errorf("Create left %s in %s", name, d)
			}
		}
	}
}

func TestClosedRun(t *testing.T) {
	r, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if err := r.Append(fullRecord("a")); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close: %v, want ErrClosed", err)
	}
	if _, err := r.PutMessages([]Message{{Role: "user"}}); !errors.Is(err, ErrClosed) {
		t.Errorf("PutMessages after Close: %v, want ErrClosed", err)
	}
	if err := r.WriteSummary(&Summary{}); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteSummary after Close: %v, want ErrClosed", err)
	}
}

func TestConcurrentAppend(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				errs <- r.Append(fullRecord(fmt.Sprintf("w%d-%d", w, i)))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, st := readAll(t, dir)
	if st.Records != workers*each || st.TornLines != 0 {
		t.Errorf("stats %+v, want %d records and no torn line", st, workers*each)
	}
	seen := map[string]bool{}
	for _, id := range ids(got) {
		seen[id] = true
	}
	if len(seen) != workers*each {
		t.Errorf("%d distinct ids, want %d", len(seen), workers*each)
	}
}

func TestWriteSummary(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	for i := 1; i <= 2; i++ {
		s := &Summary{
			Policy: Policy{Model: "m", Version: "v1"}, Final: i == 2, Records: i,
			Counts:       map[Status]int{StatusOK: i, StatusRetried: 1},
			ModelLatency: Percentiles{P50: 1, P95: 2, P99: 3},
		}
		if err := r.WriteSummary(s); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSummary(dir)
		if err != nil {
			t.Fatal(err)
		}
		want := *s
		want.Schema = SummaryVersion
		if diff := cmp.Diff(&want, got); diff != "" {
			t.Errorf("summary %d (-want +got):\n%s", i, diff)
		}
	}
	want := []string{ImagesDir, MessagesDir, RecordsFile, SummaryFile, TokensDir}
	if diff := cmp.Diff(want, names(t, dir)); diff != "" {
		t.Errorf("run directory (-want +got):\n%s", diff)
	}
	if err := r.WriteSummary(&Summary{SuccessRate: math.NaN()}); err == nil {
		t.Error("WriteSummary with a NaN succeeded, want an error")
	}
	if got, err := ReadSummary(dir); err != nil || got.Records != 2 {
		t.Errorf("after a failed WriteSummary: %+v, %v; want the previous summary", got, err)
	}
}

func ids(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.RolloutID)
	}
	return out
}

func appendRaw(t *testing.T, dir, s string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, RecordsFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
