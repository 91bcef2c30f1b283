package rl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"legato/rl/schema"
)

// JournalFile is a service's journal in its run directory: what the
// service was asked (groups, cancellations, policy changes) and the order
// in which groups ended, which is the order of its stream. rollouts.jsonl
// holds the attempts, as in a batch.
const JournalFile = schema.ServiceFile

// Journal entry kinds.
const (
	opService = "service" // the first entry: the service's settings
	opGroup   = "group"   // a group was submitted
	opDrop    = "drop"    // its caller cancelled a group
	opPolicy  = "policy"  // the policy version or state changed
	opEnd     = "end"     // a group ended; its cursor is its place in the stream
)

// journalEntry is one line of the journal. Fields are set by kind.
type journalEntry struct {
	Op string    `json:"op"`
	At time.Time `json:"at"`

	Manifest *schema.Batch `json:"manifest,omitempty"`

	ID   string `json:"id,omitempty"`
	Key  string `json:"key,omitempty"`
	Size int    `json:"size,omitempty"`
	// Attempts is how many attempts the group runs (size plus
	// oversampling).
	Attempts int `json:"attempts,omitempty"`
	// Task is the group's task as a tasks-file entry with its whole
	// config, so a restart needs no tasks file.
	Task json.RawMessage `json:"task,omitempty"`
	// TaskSHA is TaskSHA of the task as submitted: Task holds its config
	// compacted (encoding/json rewrites a raw message so), whose hash is
	// another, and records and quarantines know the task by this one.
	TaskSHA string `json:"task_sha256,omitempty"`
	// Policy is the group's own model server, without its key; Keyed
	// says it had one.
	Policy *GroupPolicy `json:"policy,omitempty"`
	Keyed  bool         `json:"keyed,omitempty"`
	// History is the group's history mode when not per-step.
	History string `json:"history,omitempty"`

	Version string `json:"version,omitempty"`
	Paused  *bool  `json:"paused,omitempty"`
	// BaseURLs are the model servers a policy change moved the calls to.
	BaseURLs []string `json:"base_urls,omitempty"`
	// Force marks a version put in force on purpose though it did not
	// come after the one before (ResetPolicy).
	Force bool `json:"force,omitempty"`

	Cursor int        `json:"cursor,omitempty"`
	State  GroupState `json:"state,omitempty"`
}

// journal appends entries to the service's journal, each synced to disk
// before append returns: what a service answered a caller survives a
// crash.
type journal struct {
	mu   sync.Mutex
	f    *os.File
	size int64 // of the whole lines written
}

// openJournal reads the journal in dir, cutting a torn last line (a crash
// mid-append: its caller never got an answer) with a warning on log, and
// opens it for appending.
func openJournal(dir string, log *slog.Logger) (*journal, []journalEntry, error) {
	path := filepath.Join(dir, JournalFile)
	var (
		entries []journalEntry
		size    int64
	)
	if fi, err := os.Stat(path); err == nil {
		size = fi.Size()
	}
	f, good, err := schema.OpenJSONLines(path, func(line []byte) error {
		e, err := decodeJournalEntry(line)
		if err == nil {
			entries = append(entries, e)
		}
		return err
	})
	if err == nil && size > good {
		lines, cerr := countLines(f, good)
		if cerr != nil {
			f.Close()
			return nil, nil, fmt.Errorf("read %s: %w", path, cerr)
		}
		log.Warn("cut a torn last line of the service journal: a crash mid-append, whose caller got no answer", "file", path, "line", lines+1, "bytes", size-good)
	}
	if errors.Is(err, schema.ErrDamagedLine) {
		err = fmt.Errorf("%w: not a journal entry: the file is damaged; move the directory aside and serve into a new one", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &journal{f: f, size: good}, entries, nil
}

// countLines counts the lines in the first n bytes of f.
func countLines(f *os.File, n int64) (int, error) {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, n))
	return bytes.Count(b, []byte{'\n'}), err
}

// decodeJournalEntry decodes one line of the journal.
func decodeJournalEntry(line []byte) (journalEntry, error) {
	var e journalEntry
	if err := json.Unmarshal(line, &e); err != nil {
		return e, err
	}
	if e.Op == "" {
		return e, errors.New("no op")
	}
	return e, nil
}

func (j *journal) append(e journalEntry) error {
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return schema.ErrClosed
	}
	line = append(line, '\n')
	_, err = j.f.Write(line)
	if err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		// Cut what reached the file, so the next entry does not follow a
		// fragment; the caller got an error, so nothing counts on it.
		_ = j.f.Truncate(j.size)
		_, _ = j.f.Seek(j.size, io.SeekStart)
		return fmt.Errorf("write the service journal: %w", err)
	}
	j.size += int64(len(line))
	return nil
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// lastBaseURLs returns the model servers the journal's last policy change
// that named any moved the service to; nil when none did.
func lastBaseURLs(entries []journalEntry) []string {
	var urls []string
	for _, e := range entries {
		if e.Op == opPolicy && len(e.BaseURLs) > 0 {
			urls = e.BaseURLs
		}
	}
	return urls
}
