package rl

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/schema"
)

// The service's journal keeps its whole entries and cuts a torn last one
// (a crash mid-append, whose caller never got an answer), warning with
// the file and the line; a damaged entry before the last is refused,
// saying what to do.
func TestOpenJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, JournalFile)
	good := `{"op":"settings"}` + "\n\n"
	if err := os.WriteFile(path, []byte(good+`{"op":"gro`), 0o644); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	j, entries, err := openJournal(dir, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil || len(entries) != 1 || j.size != int64(len(good)) {
		t.Fatalf("a torn last entry: %d entries, %v", len(entries), err)
	}
	j.close()
	if b, _ := os.ReadFile(path); string(b) != good {
		t.Errorf("the torn entry was not cut: %q", b)
	}
	for _, want := range []string{"level=WARN", "torn last line", "file=" + path, "line=3", "bytes=10"} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the cut was logged as %q, want it to say %q", logged.String(), want)
		}
	}
	logged.Reset()
	if j, _, err = openJournal(dir, slog.New(slog.NewTextHandler(&logged, nil))); err != nil {
		t.Fatal(err)
	}
	j.close()
	if logged.Len() > 0 {
		t.Errorf("a whole journal was warned about: %q", logged.String())
	}
	if err := os.WriteFile(path, []byte(good+"not json\n"+good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openJournal(dir, slog.New(slog.DiscardHandler)); !errors.Is(err, schema.ErrDamagedLine) || !strings.Contains(err.Error(), "serve into a new one") {
		t.Errorf("a damaged entry inside: %v, want it refused with what to do", err)
	}
}
