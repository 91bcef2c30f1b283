//go:build unix

package schema

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// killChildEnv names the run directory TestKillChild appends to; it is set
// only in the child process of TestAppendSurvivesKill.
const killChildEnv = "LEGATO_SCHEMA_KILL_CHILD"

// killWorkers is how many goroutines of the child append at once, so that
// the kill can land inside a group commit.
const killWorkers = 4

// TestKillChild is the child process of TestAppendSurvivesKill: each of its
// workers stores a prompt with a new screenshot and appends a record that
// refers to it, printing the record's id once Append has returned, until
// the process is killed.
func TestKillChild(t *testing.T) {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		t.Skip("helper process of TestAppendSurvivesKill")
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	for w := range killWorkers {
		wg.Go(func() {
			// Bounded so a parent that fails to kill it does not leave it running.
			for i := range 100_000 / killWorkers {
				id := fmt.Sprintf("child-%d-%d", w, i)
				hashes, err := r.PutMessages(killPrompt(id))
				if err != nil {
					t.Error(err)
					return
				}
				rec := fullRecord(id)
				rec.Steps[0].Request = hashes
				// Large enough (~200 KB) that a kill can land inside the write.
				rec.Steps[0].Response.Logprobs = make([]float64, 20_000)
				if err := r.Append(rec); err != nil {
					t.Error(err)
					return
				}
				fmt.Printf("appended %s\n", rec.RolloutID)
			}
		})
	}
	wg.Wait()
}

// killPrompt is the prompt the child stores for the record id.
func killPrompt(id string) []Message {
	return []Message{
		{Role: "system", Content: []Part{TextPart("sys")}},
		{Role: "user", Content: []Part{TextPart("step of " + id), ImagePart(dataURL(withTextChunk(tinyPNG, id)))}},
	}
}

// TestAppendSurvivesKill SIGKILLs a process in the middle of appending: every
// record whose Append returned is in the file with its prompt and
// screenshot, every record in the file loads, and a torn tail, if any, is
// reported and cut by the next writer.
func TestAppendSurvivesKill(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	r, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()

	const killAfter = 25
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var reported []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "appended "); ok {
			reported = append(reported, id)
		}
		if len(reported) == killAfter {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL; stderr:\n%s", err, stderr.String())
	}
	if len(reported) < killAfter {
		t.Fatalf("child reported %d records before it was killed, want at least %d", len(reported), killAfter)
	}

	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var inFile []string
	st, err := ReadRunRecords(dir, func(rec Record) error {
		inFile = append(inFile, rec.RolloutID)
		got, err := s.LoadRequest(rec.Steps[0], LoadOptions{})
		if err != nil {
			return err
		}
		if diff := cmp.Diff(killPrompt(rec.RolloutID), got); diff != "" {
			t.Errorf("prompt of record %s (-want +got):\n%s", rec.RolloutID, diff)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the killed run: %v", err)
	}
	for _, id := range reported {
		if !slices.Contains(inFile, id) {
			t.Errorf("record %s was reported appended but is not in %s", id, RecordsFile)
		}
	}
	// At most the records being appended at the kill, one per worker, are
	// beyond the reported ones (written, not yet printed).
	if len(inFile) > len(reported)+killWorkers {
		t.Errorf("%d records in the file, %d reported: want at most %d more", len(inFile), len(reported), killWorkers)
	}
	if st.TornLines > 1 || (st.TornLines == 1 && !st.TornTail) {
		t.Errorf("stats %+v: want at most one torn line, at the end", st)
	}
	t.Logf("killed after %d reported appends: %d records in the file, torn tail: %v", len(reported), len(inFile), st.TornTail)

	// The next writer cuts the torn tail and appends cleanly after it.
	r, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st.TornTail != (r.DroppedTail() > 0) {
		t.Errorf("TornTail = %v but Open dropped %d bytes", st.TornTail, r.DroppedTail())
	}
	if err := r.Append(fullRecord("after")); err != nil {
		t.Fatal(err)
	}
	if _, st := readAll(t, dir); st.TornLines != 0 || st.Records != len(inFile)+1 {
		t.Errorf("after reopening: stats %+v, want %d records and no torn line", st, len(inFile)+1)
	}
}
