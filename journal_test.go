package rl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/schema"
)

// The service's journal keeps its whole entries and cuts a torn last one
// (a crash mid-append, whose caller never got an answer); a damaged entry
// before the last is refused, saying what to do.
func TestOpenJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, JournalFile)
	good := `{"op":"settings"}` + "\n"
	if err := os.WriteFile(path, []byte(good+`{"op":"gro`), 0o644); err != nil {
		t.Fatal(err)
	}
	j, entries, err := openJournal(dir)
	if err != nil || len(entries) != 1 || j.size != int64(len(good)) {
		t.Fatalf("a torn last entry: %d entries, %v", len(entries), err)
	}
	j.close()
	if b, _ := os.ReadFile(path); string(b) != good {
		t.Errorf("the torn entry was not cut: %q", b)
	}
	if err := os.WriteFile(path, []byte(good+"not json\n"+good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openJournal(dir); !errors.Is(err, schema.ErrDamagedLine) || !strings.Contains(err.Error(), "serve into a new one") {
		t.Errorf("a damaged entry inside: %v, want it refused with what to do", err)
	}
}
