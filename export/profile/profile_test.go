package profile_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/export"
	"legato/rl/export/profile"
	"legato/rl/schema"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixedRun is the run directory export's tests generate; see
// export/run_test.go for what it holds.
const fixedRun = "../testdata/run"

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func build(t *testing.T, dir string) *profile.Report {
	t.Helper()
	rep, err := profile.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestTextReport(t *testing.T) {
	var b bytes.Buffer
	if err := profile.WriteText(&b, build(t, fixedRun)); err != nil {
		t.Fatal(err)
	}
	golden(t, "report.golden.txt", b.Bytes())
}

// tornCopy copies the fixed run and appends half a record, as a crash
// mid-append leaves it.
func tornCopy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`{"schema":"legato.rollout/v0","rollout_id":"r-torn","sta`); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTextReportTorn checks that a torn last line changes nothing but a
// warning at the end of the report.
func TestTextReportTorn(t *testing.T) {
	dir := tornCopy(t)
	var b bytes.Buffer
	if err := profile.WriteText(&b, build(t, dir)); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "report.golden.txt"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Replace(b.String(), dir, fixedRun, 1)
	body, warning, ok := strings.Cut(got, "warning: ")
	if !ok {
		t.Fatalf("no warning in the report of a torn run:\n%s", got)
	}
	if diff := cmp.Diff(string(want), body); diff != "" {
		t.Errorf("report before the warning (-want +got):\n%s", diff)
	}
	if wantW := "1 unreadable line(s) of rollouts.jsonl were skipped; first: rollouts.jsonl line 12"; !strings.HasPrefix(warning, wantW) {
		t.Errorf("warning %q, want it to start with %q", warning, wantW)
	}
}

// TestBuildTimeline checks the rows of the timeline: each desktop's
// attempts in order of start, skipped attempts (never ran) left out, and
// segments that follow export.Timeline within one bucket.
func TestBuildTimeline(t *testing.T) {
	rep := build(t, fixedRun)
	got := map[int][]string{}
	for _, d := range rep.Desktops {
		for _, r := range d.Rollouts {
			got[d.Slot] = append(got[d.Slot], r.ID+" "+string(r.Status))
		}
	}
	want := map[int][]string{
		0: {"r-a0 ok", "r-a1 truncated", "r-b1 ok", "r-b2 cancelled", "r-c1 ok"},
		1: {"r-a1-try0 retried", "r-a2 surplus", "r-b0 ok", "r-c0 error", "r-c2 error"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}

	recs := map[string]schema.Record{}
	schema.ReadRunRecords(fixedRun, func(r schema.Record) error { recs[r.RolloutID] = r; return nil })
	bucket := rep.End.Sub(rep.Start).Seconds() / 4800
	for _, d := range rep.Desktops {
		for _, r := range d.Rollouts {
			rec := recs[r.ID]
			spans := export.Timeline(&rec)
			if len(spans) != len(r.Segments) {
				t.Errorf("%s: %d segments, want one per span of its timeline (%d)", r.ID, len(r.Segments), len(spans))
				continue
			}
			for i, s := range spans {
				seg := r.Segments[i]
				from, to := s.Start.Sub(rep.Start).Seconds(), s.End.Sub(rep.Start).Seconds()
				if seg.Phase != s.Phase || abs(seg.From-from) > bucket || abs(seg.To-to) > bucket {
					t.Errorf("%s segment %d = %+v, want %s from %.3f to %.3f within %.4f", r.ID, i, seg, s.Phase, from, to, bucket)
				}
			}
		}
	}
}

func abs(v float64) float64 { return max(v, -v) }

func TestWriteHTMLFile(t *testing.T) {
	rep := build(t, fixedRun)
	path := filepath.Join(t.TempDir(), "profile.html")
	if err := profile.WriteHTMLFile(path, rep); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := profile.WriteHTML(&want, rep); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("%s holds %d bytes, want the %d bytes WriteHTML writes", path, len(got), want.Len())
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("the directory holds %d entries, want only the page (no temp file left)", len(ents))
	}
	if err := profile.WriteHTMLFile(filepath.Join(t.TempDir(), "missing", "p.html"), rep); err == nil {
		t.Error("WriteHTMLFile into a missing directory succeeded")
	}
}

// TestBuildUsesCollectSummary checks that what only collect knows (whether
// the batch ended, which groups closed) comes from its summary.json.
func TestBuildUsesCollectSummary(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, schema.SummaryFile), []byte(`{"schema":"legato.summary/v0","final":true,"groups_closed":2,"records":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := build(t, dir)
	if !rep.Summary.Final || rep.Summary.GroupsClosed != 2 || rep.Summary.Records != 11 {
		t.Errorf("Final %v, GroupsClosed %d, Records %d; want true, 2 from summary.json and 11 from the records",
			rep.Summary.Final, rep.Summary.GroupsClosed, rep.Summary.Records)
	}
	var b bytes.Buffer
	if err := profile.WriteText(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "(final)") || !strings.Contains(b.String(), "3 groups (2 closed)") {
		t.Errorf("report does not show the batch as final with 2 closed groups:\n%s", b.String())
	}
}

// TestWriteHTMLFileRefusesRunFiles: the page never replaces one of the
// run's own files, while a new page inside the run directory is written.
func TestWriteHTMLFileRefusesRunFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	rep := build(t, dir)
	for _, name := range []string{schema.BatchFile, schema.RecordsFile, schema.SummaryFile,
		filepath.Join(schema.MessagesDir, "x.html"), schema.ImagesDir} {
		path := filepath.Join(dir, name)
		before, _ := os.ReadFile(path)
		if err := profile.WriteHTMLFile(path, rep); !errors.Is(err, schema.ErrRunFile) {
			t.Errorf("WriteHTMLFile(%s) = %v, want schema.ErrRunFile", name, err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Errorf("a refused page changed %s", name)
		}
	}
	page := filepath.Join(dir, "profile.html")
	if err := profile.WriteHTMLFile(page, rep); err != nil {
		t.Errorf("a new page inside the run: %v", err)
	}
	if _, err := os.Stat(page); err != nil {
		t.Error(err)
	}
}
