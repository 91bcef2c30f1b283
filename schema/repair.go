package schema

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"
)

// QuarantineFile is the file of a run directory that holds the lines Repair
// took out of rollouts.jsonl, so that nothing is ever deleted.
const QuarantineFile = "rollouts.quarantine.jsonl"

// QuarantinedLine is one line of QuarantineFile: a line Repair moved out of
// rollouts.jsonl, where it was and why.
type QuarantinedLine struct {
	// Line is the 1-based line number in rollouts.jsonl at the time of the
	// repair; Offset the byte offset of its start.
	Line   int    `json:"line"`
	Offset int64  `json:"offset"`
	Reason string `json:"reason"`
	// Text is the line, without its newline, when it is valid UTF-8;
	// Base64 holds it otherwise (JSON cannot carry other bytes verbatim).
	Text     string    `json:"text,omitempty"`
	Base64   []byte    `json:"base64,omitempty"`
	Repaired time.Time `json:"repaired_at"`
}

// RepairStats says what Repair moved.
type RepairStats struct {
	// Unreadable counts the lines that are not records (damage), and
	// Duplicates the later final records of an already decided attempt.
	Unreadable, Duplicates int
	// Lines lists every moved line, in file order.
	Lines []QuarantinedLine
}

// Moved is the number of lines moved to the quarantine file.
func (s RepairStats) Moved() int { return len(s.Lines) }

// Repair makes rollouts.jsonl readable by every reader of a run, moving
// what the read rule refuses to QuarantineFile: each unreadable line (not
// JSON, not a record, longer than MaxRecordBytes; a torn last line was
// already cut by Create), and each later final record of an attempt that
// AttemptRule already decided. The first final record stays: it is the one
// collect's resume and any earlier export took as the attempt's, so a
// trainer's groups keep the data it was given. A record of another schema
// version is an error: it is not damage, and this legato cannot judge it.
//
// The quarantine is appended and synced first, then rollouts.jsonl is
// rewritten through a temp file (synced, renamed, directory synced), so a
// crash at any point loses no line. Repair holds the run's lock, so no
// collect appends meanwhile; it must be called before the first Append.
// With nothing to move it changes no file.
func (r *Run) Repair() (RepairStats, error) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return RepairStats{}, ErrClosed
	}
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	if r.open != nil || r.last != nil {
		return RepairStats{}, errors.New("repair: records were appended already; repair a run before writing to it")
	}
	keep, st, err := scanForRepair(io.NewSectionReader(r.f, 0, r.size))
	if err != nil || st.Moved() == 0 {
		return st, err
	}
	if err := appendQuarantine(filepath.Join(r.dir, QuarantineFile), st.Lines); err != nil {
		return st, fmt.Errorf("repair: %w", err)
	}
	f, size, err := r.rewriteRecords(keep)
	if err != nil {
		return st, fmt.Errorf("repair: %w", err)
	}
	r.f.Close()
	r.f, r.size = f, size
	return st, nil
}

// scanForRepair reads rollouts.jsonl and returns, for each line, whether it
// stays, and the lines to move.
func scanForRepair(rd io.Reader) (keep []bool, st RepairStats, err error) {
	br := bufio.NewReaderSize(rd, 64<<10)
	rule := NewAttemptRule()
	var off int64
	now := time.Now().UTC()
	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n')
		if len(line) == 0 && rerr == io.EOF {
			return keep, st, nil
		}
		if rerr != nil && rerr != io.EOF {
			return nil, st, fmt.Errorf("repair: read %s: %w", RecordsFile, rerr)
		}
		reason := judgeLine(bytes.TrimSuffix(line, []byte("\n")), n, rule, &st)
		if errors.Is(reason, ErrSchemaVersion) {
			return nil, st, &LineError{Line: n, Offset: off, Err: reason}
		}
		keep = append(keep, reason == nil)
		if reason != nil {
			q := QuarantinedLine{Line: n, Offset: off, Reason: reason.Error(), Repaired: now}
			body := bytes.TrimSuffix(line, []byte("\n"))
			if utf8.Valid(body) {
				q.Text = string(body)
			} else {
				q.Base64 = bytes.Clone(body)
			}
			st.Lines = append(st.Lines, q)
		}
		off += int64(len(line))
	}
}

// judgeLine returns why line n must move, or nil when it stays.
func judgeLine(line []byte, n int, rule *AttemptRule, st *RepairStats) error {
	if len(bytes.TrimSpace(line)) == 0 {
		return nil
	}
	if len(line) > MaxRecordBytes {
		st.Unreadable++
		return fmt.Errorf("%w: line longer than %d bytes", ErrRecordTooLarge, MaxRecordBytes)
	}
	rec, err := parseRecord(line)
	if errors.Is(err, ErrSchemaVersion) {
		return err
	}
	if err != nil {
		st.Unreadable++
		return fmt.Errorf("unreadable: %w", err)
	}
	if _, err := rule.Add(&rec, n); err != nil {
		st.Duplicates++
		return err
	}
	return nil
}

// appendQuarantine appends lines to path and syncs it, creating it (and
// syncing its directory) when needed.
func appendQuarantine(path string, lines []QuarantinedLine) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for i := range lines {
		if err := enc.Encode(&lines[i]); err != nil {
			f.Close()
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if statErr != nil {
		return syncDir(filepath.Dir(path))
	}
	return nil
}

// rewriteRecords writes the kept lines of rollouts.jsonl to a temp file,
// locks and syncs it, and renames it over rollouts.jsonl. The new file is
// locked before its rename, so no other writer can take it in between. It
// returns the new file, open for appending, and its size.
func (r *Run) rewriteRecords(keep []bool) (_ *os.File, size int64, err error) {
	// O_APPEND, as openRun opens it: Append relies on it after a cut.
	nf, err := createTempFlags(r.dir, tempPrefix, os.O_APPEND)
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		if err != nil {
			nf.Close()
			os.Remove(nf.Name())
		}
	}()
	if err := lockFile(nf); err != nil {
		return nil, 0, err
	}
	br := bufio.NewReaderSize(io.NewSectionReader(r.f, 0, r.size), 64<<10)
	bw := bufio.NewWriterSize(nf, 1<<20)
	for _, k := range keep {
		line, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, 0, err
		}
		if k {
			n, err := bw.Write(line)
			size += int64(n)
			if err != nil {
				return nil, 0, err
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return nil, 0, err
	}
	if err := nf.Sync(); err != nil {
		return nil, 0, err
	}
	if err := os.Rename(nf.Name(), filepath.Join(r.dir, RecordsFile)); err != nil {
		return nil, 0, err
	}
	if err := syncDir(r.dir); err != nil {
		return nil, 0, err
	}
	return nf, size, nil
}
