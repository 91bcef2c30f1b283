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
)

// ReadStats describes one pass over rollouts.jsonl.
type ReadStats struct {
	// Records is the number of records passed to the callback.
	Records int
	// Lines counts every line read: records, blank lines and torn lines.
	Lines int
	// BlankLines counts empty or whitespace-only lines, which are skipped.
	BlankLines int
	// TornLines counts the unreadable lines that were skipped: a last line
	// without its newline (a crash mid-append), and any line that is not
	// a legato record.
	TornLines int
	// TornTail reports whether the last non-blank line was torn.
	TornTail bool
	// TornOffset is the byte offset of the first torn line; it is only
	// meaningful when TornLines > 0.
	TornOffset int64
	// FirstTorn says where the first torn line is and why it was skipped;
	// nil when TornLines is 0.
	FirstTorn *LineError
}

// TornInside returns the first unreadable line that is not the last line
// (blank lines aside), or nil when there is none. A torn last line is what
// a crash mid-append leaves, and its attempt runs again on resume; a torn
// line anywhere else cannot come from legato's writer: the file was
// damaged, and the record it held is lost. Collect's resume skips it; a
// reader that computes over whole groups (export's advantages) must not.
func (s ReadStats) TornInside() *LineError {
	if s.TornLines > 1 || s.TornLines == 1 && !s.TornTail {
		// Lines are read in order, so the first torn line is before the
		// last one.
		return s.FirstTorn
	}
	return nil
}

// ReadRecords calls fn for each record of a rollouts.jsonl stream, in order,
// holding one line in memory at a time. It stops at the first error of fn
// and returns it unchanged.
//
// A line is a record when it ends with a newline, parses as a Record and its
// schema is Version. Unreadable lines are skipped and counted in
// ReadStats.TornLines, never fatal, so one damaged line never costs a batch:
// a last line without its newline is the torn tail of a crash mid-append
// (its Append never returned, so no finished attempt is lost); a bad line
// elsewhere cannot come from legato's writer (Append and Create cut
// fragments), so it means outside damage, reported by FirstTorn. A record
// with a different schema version is an error (ErrSchemaVersion): reading
// it as this version would be wrong.
func ReadRecords(r io.Reader, fn func(Record) error) (ReadStats, error) {
	return readRecords(r, func(rec Record, _ int, _ int64) error { return fn(rec) }, MaxRecordBytes)
}

// ReadRecordLines is ReadRecords passing each record's 1-based line number
// too, so a reader can name the line of a record it refuses.
func ReadRecordLines(r io.Reader, fn func(rec Record, line int) error) (ReadStats, error) {
	return readRecords(r, func(rec Record, line int, _ int64) error { return fn(rec, line) }, MaxRecordBytes)
}

// ReadRunRecordsAt reads dir/rollouts.jsonl like ReadRunRecordLines,
// passing each record's byte offset too, for ReadRecordAt.
func ReadRunRecordsAt(dir string, fn func(rec Record, line int, off int64) error) (ReadStats, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	return readRecords(f, fn, MaxRecordBytes)
}

// ReadRecordsAt reads the records whose lines start at the byte offsets
// offs of dir/rollouts.jsonl (Run.AppendAt, ReadRunRecordsAt), in that
// order, opening the file once.
func ReadRecordsAt(dir string, offs []int64) ([]Record, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	recs := make([]Record, 0, len(offs))
	for _, off := range offs {
		line, err := bufio.NewReader(io.NewSectionReader(f, off, MaxRecordBytes)).ReadBytes('\n')
		var rec Record
		if err == nil {
			rec, err = parseRecord(line)
		}
		if err != nil {
			return nil, fmt.Errorf("read the record at byte %d of %s: %w", off, RecordsFile, err)
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// ReadRunRecords reads dir/rollouts.jsonl with ReadRecords. It may run while
// a Run appends to the file: a record being written shows as a torn tail.
func ReadRunRecords(dir string, fn func(Record) error) (ReadStats, error) {
	return ReadRunRecordLines(dir, func(rec Record, _ int) error { return fn(rec) })
}

// ReadRunRecordLines is ReadRunRecords with line numbers (ReadRecordLines).
func ReadRunRecordLines(dir string, fn func(rec Record, line int) error) (ReadStats, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	return ReadRecordLines(f, fn)
}

var (
	errNoNewline = errors.New("no newline at the end (torn by a crash mid-append)")
	errNoSchema  = errors.New("not a legato record (no schema field)")
)

func readRecords(r io.Reader, fn func(Record, int, int64) error, maxLine int) (ReadStats, error) {
	var st ReadStats
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	var off int64
	torn := func(lineErr *LineError) {
		st.TornLines++
		st.TornTail = true
		if st.FirstTorn == nil {
			st.FirstTorn = lineErr
			st.TornOffset = lineErr.Offset
		}
	}
	for {
		line, n, complete, tooLong, err := readLine(br, buf[:0], maxLine)
		buf = line[:0]
		if err != nil {
			return st, fmt.Errorf("read records: line %d: %w", st.Lines+1, err)
		}
		if n == 0 {
			return st, nil
		}
		st.Lines++
		at := &LineError{Line: st.Lines, Offset: off}
		off += n
		switch {
		case tooLong:
			at.Err = fmt.Errorf("%w: line longer than %d bytes", ErrRecordTooLarge, maxLine)
			torn(at)
		case len(bytes.TrimSpace(line)) == 0:
			st.BlankLines++
		case !complete:
			at.Err = errNoNewline
			torn(at)
		default:
			rec, err := parseRecord(line)
			if errors.Is(err, ErrSchemaVersion) {
				at.Err = err
				return st, at
			}
			if err != nil {
				at.Err = err
				torn(at)
				break
			}
			st.TornTail = false
			st.Records++
			if err := fn(rec, st.Lines, at.Offset); err != nil {
				return st, err
			}
		}
		if !complete {
			return st, nil
		}
	}
}

// parseRecord parses one complete line. An error matching ErrSchemaVersion
// is fatal; any other means the line is unreadable.
func parseRecord(line []byte) (Record, error) {
	var rec Record
	if err := json.Unmarshal(line, &rec); err != nil {
		return Record{}, err
	}
	switch rec.Schema {
	case Version:
		return rec, nil
	case "":
		return Record{}, errNoSchema
	default:
		return Record{}, fmt.Errorf("%w %q: this legato reads %q", ErrSchemaVersion, rec.Schema, Version)
	}
}

// readLine reads one line into buf, without its newline, and returns it with
// the number of bytes consumed. complete reports whether the line ended with
// a newline (not EOF). A line longer than max is consumed but not kept
// (tooLong), so memory stays bounded on a damaged file.
func readLine(br *bufio.Reader, buf []byte, max int) (line []byte, n int64, complete, tooLong bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		n += int64(len(frag))
		if !tooLong {
			if len(buf)+len(frag) > max+1 { // +1: the newline
				tooLong = true
				buf = buf[:0]
			} else {
				buf = append(buf, frag...)
			}
		}
		switch err {
		case nil:
			return bytes.TrimSuffix(buf, []byte("\n")), n, true, tooLong, nil
		case bufio.ErrBufferFull:
			continue
		case io.EOF:
			return buf, n, false, tooLong, nil
		default:
			return buf, n, false, tooLong, err
		}
	}
}
