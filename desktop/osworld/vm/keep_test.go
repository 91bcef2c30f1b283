package vm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSweepKept: a kept state whose writer died is removed; one being
// written, a whole one, and directories not made by Keep stay.
func TestSweepKept(t *testing.T) {
	dir := t.TempDir()
	writing, writingLock, err := newKeptDir(filepath.Join(dir, "osworld-end-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer writingLock.Close()
	died, diedLock, err := newKeptDir(filepath.Join(dir, "osworld-end-b"))
	if err != nil {
		t.Fatal(err)
	}
	diedLock.Close() // its writer is gone
	if err := os.WriteFile(filepath.Join(died, keptStream), []byte("half a stream"), 0o600); err != nil {
		t.Fatal(err)
	}
	whole := filepath.Join(dir, "osworld-end-c")
	foreign := filepath.Join(dir, keptNewPrefix+"someone-elses")
	for _, d := range []string{whole, foreign} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Made, never locked (the writer died in between): empty, and gone
	// once a minute old; a fresh one may be locked any moment.
	oldMade := filepath.Join(dir, keptMakePrefix+"osworld-end-d")
	newMade := filepath.Join(dir, keptMakePrefix+"osworld-end-e")
	for _, d := range []string{oldMade, newMade} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(oldMade, hour, hour); err != nil {
		t.Fatal(err)
	}
	removed, err := SweepKept(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{oldMade, died}; !slices.Equal(removed, want) {
		t.Errorf("SweepKept removed %q, want only %q", removed, want)
	}
	for _, d := range []string{writing, whole, foreign, newMade} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v; want it kept", d, err)
		}
	}
	if _, err := os.Stat(died); err == nil {
		t.Errorf("%s still exists", died)
	}
	if removed, err := SweepKept(filepath.Join(dir, "none")); err != nil || removed != nil {
		t.Errorf("SweepKept of a missing directory: %q, %v", removed, err)
	}
}
