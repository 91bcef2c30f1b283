package schema

import (
	"errors"
	"syscall"
	"testing"
)

// TestWriteSummaryFullDisk: when the atomic write of the final summary
// fails, as on a full disk, summary.json is rewritten in place and no
// longer says running; a refresh during the batch is not (a reader could
// see it half-written).
func TestWriteSummaryFullDisk(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	defer r.Close()
	if err := r.WriteSummary(&Summary{State: StateRunning, Tasks: 3}); err != nil {
		t.Fatal(err)
	}
	r.hooks.summaryWrite = func() error { return syscall.ENOSPC }

	if err := r.WriteSummary(&Summary{State: StateRunning, Tasks: 4}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("refresh on a full disk: %v, want ENOSPC", err)
	}
	if s, err := ReadSummary(dir); err != nil || s.Tasks != 3 {
		t.Fatalf("summary after a failed refresh: %+v, %v; want the old one", s, err)
	}

	err := r.WriteSummary(&Summary{Final: true, State: StateStopped, StopReason: "disk full", Tasks: 3})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("final write on a full disk: %v, want the error reported", err)
	}
	s, err := ReadSummary(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Final || s.State != StateStopped || s.StopReason != "disk full" {
		t.Errorf("summary.json after the final write: final %v, state %q, reason %q; want final, stopped, disk full", s.Final, s.State, s.StopReason)
	}
}
