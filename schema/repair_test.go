package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAttemptRule: retried records never decide an attempt, an error
// record is replaced by a rerun, any other final record is the last word.
func TestAttemptRule(t *testing.T) {
	rule := NewAttemptRule()
	add := func(attempt int, s Status, line int) (bool, error) {
		r := fullRecord("x")
		r.Attempt, r.Status = attempt, s
		return rule.Add(r, line)
	}
	for i, tc := range []struct {
		attempt   int
		status    Status
		wantRerun bool
		wantDup   bool
	}{
		{0, StatusRetried, false, false},
		{0, StatusError, false, false},
		{0, StatusRetried, false, false},
		{0, StatusOK, true, false},
		{0, StatusSkipped, false, true},
		{1, StatusCancelled, false, false},
		{1, StatusError, false, true},
	} {
		rerun, err := add(tc.attempt, tc.status, i+1)
		var dup *DuplicateFinalError
		if rerun != tc.wantRerun || errors.As(err, &dup) != tc.wantDup || (err != nil) != tc.wantDup {
			t.Errorf("line %d (%s): rerun %v, err %v; want rerun %v, duplicate %v", i+1, tc.status, rerun, err, tc.wantRerun, tc.wantDup)
		}
	}
}

// TestGroupEnded: a group ended when it got its size of finished attempts
// or every attempt has a final record; one cut short has neither. The
// rule's tallies count an error record a rerun replaced once, and retried
// records not at all.
func TestGroupEnded(t *testing.T) {
	for _, tc := range []struct {
		name                            string
		finished, final, size, attempts int
		want                            bool
	}{
		{"closed", 4, 4, 4, 4, true},
		{"closed, oversampled attempts without records", 4, 4, 4, 5, true},
		{"closed, surplus and cancelled recorded", 4, 6, 4, 6, true},
		{"ended on errors", 2, 5, 4, 5, true},
		{"dropped, nothing finished", 0, 4, 4, 4, true},
		{"cut short: 3 of 4", 3, 3, 4, 4, false},
		{"cut short: nothing recorded", 0, 0, 4, 5, false},
		{"cut short, oversampled: every attempt but one", 3, 4, 4, 5, false},
		{"no attempts_per_task: the group size", 1, 2, 2, 0, true},
		{"no group size: not judged", 0, 0, 0, 0, true},
	} {
		if got := GroupEnded(tc.finished, tc.final, tc.size, tc.attempts); got != tc.want {
			t.Errorf("%s: GroupEnded(%d, %d, %d, %d) = %v, want %v", tc.name, tc.finished, tc.final, tc.size, tc.attempts, got, tc.want)
		}
	}

	rule := NewAttemptRule()
	for i, tc := range []struct {
		attempt int
		status  Status
	}{{0, StatusOK}, {1, StatusRetried}, {1, StatusError}, {2, StatusOK}, {1, StatusError}, {3, StatusRetried}} {
		r := fullRecord("x")
		r.Attempt, r.Status = tc.attempt, tc.status
		if _, err := rule.Add(r, i+1); err != nil {
			t.Fatal(err)
		}
	}
	g := fullRecord("x").GroupID
	if rule.GroupEnded(g, 3, 4) || !rule.GroupEnded(g, 2, 4) || !rule.GroupEnded(g, 3, 3) {
		t.Errorf("2 finished and 3 attempts decided: ended %v (of 3, 4 attempts), %v (of 2), %v (of 3, 3 attempts); want false, true, true",
			rule.GroupEnded(g, 3, 4), rule.GroupEnded(g, 2, 4), rule.GroupEnded(g, 3, 3))
	}
	if !rule.GroupEnded("other", 0, 0) || rule.GroupEnded("other", 2, 2) {
		t.Error("a group without records: want it judged only with a group size")
	}
}

// TestRepair moves a damaged line, a duplicate final record and a line of
// invalid UTF-8 to the quarantine file, keeps the rest in order, and leaves
// the run locked and appendable.
func TestRepair(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	rec := func(id string, attempt int, s Status) *Record {
		x := fullRecord(id)
		x.Attempt, x.Status = attempt, s
		return x
	}
	if err := r.Append(rec("a", 0, StatusOK)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	appendRaw(t, dir, "{\"schema\":\"legato.rollout/v0\",\"rollout_id\n") // line 2
	line3, _ := json.Marshal(rec("b", 0, StatusOK))                       // duplicate of a
	appendRaw(t, dir, string(line3)+"\n")
	for _, x := range []*Record{rec("c", 1, StatusError), rec("d", 1, StatusOK)} { // lines 4, 5: a rerun
		b, _ := json.Marshal(x)
		appendRaw(t, dir, string(b)+"\n")
	}
	appendRaw(t, dir, "\xff\xfe\n") // line 6

	r = mustCreate(t, dir)
	defer r.Close()
	st, err := r.Repair()
	if err != nil {
		t.Fatal(err)
	}
	var moved []int
	for _, l := range st.Lines {
		moved = append(moved, l.Line)
	}
	if diff := cmp.Diff([]int{2, 3, 6}, moved); diff != "" || st.Unreadable != 2 || st.Duplicates != 1 {
		t.Fatalf("moved lines (-want +got):\n%s%+v", diff, st)
	}
	if !strings.Contains(st.Lines[1].Reason, "lines 1 and 3") {
		t.Errorf("duplicate's reason %q does not name both lines", st.Lines[1].Reason)
	}
	if err := r.Append(rec("e", 2, StatusOK)); err != nil {
		t.Fatalf("Append after Repair: %v", err)
	}
	got, rs := readAll(t, dir)
	if diff := cmp.Diff([]string{"a", "c", "d", "e"}, ids(got)); diff != "" || rs.TornLines != 0 {
		t.Errorf("records after repair (-want +got):\n%s; torn lines %d", diff, rs.TornLines)
	}
	if r2, err := Create(dir); !errors.Is(err, ErrLocked) {
		if err == nil {
			r2.Close()
		}
		t.Errorf("Create during a repaired run: %v, want ErrLocked", err)
	}

	q, err := os.ReadFile(filepath.Join(dir, QuarantineFile))
	if err != nil {
		t.Fatal(err)
	}
	var ql []QuarantinedLine
	dec := json.NewDecoder(bytes.NewReader(q))
	for dec.More() {
		var l QuarantinedLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		ql = append(ql, l)
	}
	if len(ql) != 3 || ql[1].Text != string(line3) || !bytes.Equal(ql[2].Base64, []byte("\xff\xfe")) {
		t.Errorf("quarantine = %+v, want lines 2, 3 and 6 with their bytes", ql)
	}
	for _, n := range names(t, dir) {
		if strings.HasPrefix(n, tempPrefix) {
			t.Errorf("repair left temp file %s", n)
		}
	}
}

// TestRepairRefusesOtherVersion: a record of another schema version is not
// damage; repair leaves the file alone and says which line.
func TestRepairRefusesOtherVersion(t *testing.T) {
	dir := t.TempDir()
	mustCreate(t, dir).Close()
	appendRaw(t, dir, "{\"schema\":\"legato.rollout/v9\"}\n")
	r := mustCreate(t, dir)
	defer r.Close()
	var le *LineError
	if _, err := r.Repair(); !errors.Is(err, ErrSchemaVersion) || !errors.As(err, &le) || le.Line != 1 {
		t.Fatalf("Repair = %v, want ErrSchemaVersion at line 1", err)
	}
	if _, err := os.Stat(filepath.Join(dir, QuarantineFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("quarantine file made: %v", err)
	}
}
