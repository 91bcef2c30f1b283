package schema

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestEarlySync: a stored screenshot is fsynced before any record commits,
// and the commit after it syncs its directory but not the file again.
func TestEarlySync(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	img := filepath.Join(dir, ImagesDir)
	synced := make(chan string, 16)
	r.hooks.synced = func(path string) { synced <- path }
	msgs := []Message{{Role: "user", Content: []Part{ImagePart(dataURL(withTextChunk(tinyPNG, "early")))}}}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	var first string
	select {
	case first = <-synced: // no record yet: only the early syncer syncs
	case <-time.After(2 * time.Minute):
		t.Fatal("the screenshot was not synced before any commit")
	}
	if filepath.Dir(first) != img || !strings.HasSuffix(first, ".png") {
		t.Fatalf("first fsync %s; want the screenshot, synced early", first)
	}
	rec := fullRecord("a")
	rec.Steps = rec.Steps[:1]
	rec.Steps[0].Request = hashes
	if err := r.Append(rec); err != nil {
		t.Fatal(err)
	}
	close(synced)
	var dirSynced bool
	for p := range synced {
		if p == first {
			t.Errorf("%s fsynced again by the commit", p)
		}
		dirSynced = dirSynced || p == img
	}
	if !dirSynced {
		t.Error("the commit did not sync the images directory, which gained a name")
	}
}

// TestEarlySyncFails: a screenshot whose fsync fails fails the next
// commit (its record is not written) whether the early syncer or the
// commit met the failure; stored again, it commits, and later commits do
// not keep failing on it.
func TestEarlySyncFails(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	var failing atomic.Bool
	failing.Store(true)
	r.hooks.syncFile = func(path string) error {
		if failing.Load() && filepath.Dir(path) == filepath.Join(dir, ImagesDir) {
			return errors.New("input/output error")
		}
		return nil
	}
	msgs := []Message{{Role: "user", Content: []Part{ImagePart(dataURL(withTextChunk(tinyPNG, "fails")))}}}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	rec := fullRecord("a")
	rec.Steps = rec.Steps[:1]
	rec.Steps[0].Request = hashes
	if err := r.Append(rec); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("Append with a screenshot that could not be synced: %v, want its sync error", err)
	}
	failing.Store(false)
	if _, err := r.PutMessages(msgs); err != nil {
		t.Fatal(err)
	}
	if err := r.Append(rec); err != nil {
		t.Fatalf("Append after the screenshot was stored again: %v", err)
	}
	if err := r.Append(fullRecord("b")); err != nil {
		t.Fatalf("a later Append: %v", err)
	}
	if recs, st := readAll(t, dir); st.Records != 2 || recs[0].RolloutID != "a" {
		t.Fatalf("%d records, want a and b", st.Records)
	}
}
