package benchrun

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"legato/rl/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGenerate: a run is written once and reused as it is; a directory of
// other files is refused, untouched.
func TestGenerate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	r := Run{Rollouts: 8, Steps: 2, Group: 4, PromptIDs: true}
	wrote, err := Generate(dir, r)
	if err != nil || !wrote {
		t.Fatalf("first Generate: wrote %v, %v", wrote, err)
	}
	records, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(records, []byte("\n")); n != 8 {
		t.Errorf("%d records, want 8", n)
	}
	if wrote, err := Generate(dir, r); err != nil || wrote {
		t.Errorf("second Generate: wrote %v, %v; want the run reused", wrote, err)
	}
	other := t.TempDir()
	mine := filepath.Join(other, "notes.txt")
	if err := os.WriteFile(mine, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(other, r); err == nil || !strings.Contains(err.Error(), "no complete generated run") {
		t.Errorf("Generate into a directory of other files: %v", err)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 1 {
		t.Errorf("Generate wrote into a directory of other files: %d entries", len(entries))
	}
}

// TestCopyTime copies a file and leaves no copy behind.
func TestCopyTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := CopyTime(path)
	if err != nil || d <= 0 {
		t.Fatalf("CopyTime: %v, %v", d, err)
	}
	if _, err := os.Stat(path + ".copy"); !os.IsNotExist(err) {
		t.Errorf("the copy is still there: %v", err)
	}
	if _, err := CopyTime(path + ".missing"); err == nil {
		t.Error("CopyTime of a missing file: no error")
	}
	apparent, disk, err := DiskUsage(filepath.Dir(path))
	if err != nil || apparent != 1<<20 || disk < apparent {
		t.Errorf("DiskUsage: %d apparent, %d on disk, %v; want 1 MiB, at least as much", apparent, disk, err)
	}
}
