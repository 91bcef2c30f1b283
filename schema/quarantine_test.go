package schema

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Batches sharing a quarantine file add at once: no entry is lost, and an
// entry for a task and config already held stays as first written.
func TestAddQuarantinedConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q", "quarantine.json")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				id := fmt.Sprintf("w%d-t%d", w, i)
				if _, err := AddQuarantined(path, map[string]QuarantinedTask{id: {TaskSHA: "s", Reason: QuarantineSetupFails, Evidence: "x"}}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	q, err := ReadQuarantine(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Tasks) != 40 {
		t.Errorf("%d entries, want 40", len(q.Tasks))
	}
	added, err := AddQuarantined(path, map[string]QuarantinedTask{"w0-t0": {TaskSHA: "s", Reason: QuarantineGraderDisagrees, Evidence: "y"}})
	if err != nil || len(added) != 0 {
		t.Errorf("adding a held task again: added %v, %v", added, err)
	}
	added, err = AddQuarantined(path, map[string]QuarantinedTask{"w0-t0": {TaskSHA: "other", Reason: QuarantineGraderDisagrees, Evidence: "y"}})
	if err != nil || len(added) != 1 {
		t.Errorf("adding the task with another config: added %v, %v; want it replaced", added, err)
	}
	q, _ = ReadQuarantine(path)
	if _, ok := q.Holds("w0-t0", "s"); ok {
		t.Error("the old config is still held")
	}
	if e, ok := q.Holds("w0-t0", "other"); !ok || e.Reason != QuarantineGraderDisagrees {
		t.Errorf("the new config: %+v %v", e, ok)
	}
}

func TestReadQuarantineBad(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"not json":     `{"schema":`,
		"other schema": `{"schema":"legato.quarantine/v9","tasks":{}}`,
		"no sha":       `{"schema":"legato.quarantine/v0","tasks":{"t":{"reason":"setup_fails"}}}`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadQuarantine(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	q, err := ReadQuarantine(filepath.Join(dir, "missing.json"))
	if err != nil || len(q.Tasks) != 0 {
		t.Errorf("a missing file: %+v, %v; want an empty quarantine", q, err)
	}
}
