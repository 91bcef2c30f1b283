package schema

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
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
// on the caller's goroutine; a few batches of lines are parsed ahead, one
// per CPU, so memory stays bounded whatever the file's size. It stops at the first error of fn
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

// ReadRecordsText is ReadRecordLines giving fn each record's RecordText
// too, which holds the text of its logprobs for a writer to copy.
func ReadRecordsText(r io.Reader, fn func(rec Record, text *RecordText, line int) error) (ReadStats, error) {
	return ReadRecordsTextWith(r, ReadOptions{}, fn)
}

// ReadOptions say what a reader leaves out of the records it is given.
type ReadOptions struct {
	// NoRequests leaves each step's Request nil. Every step's request
	// repeats the one before's message hashes and adds its own, a third of
	// a record's line; a reader that never loads the prompts' messages (a
	// contiguous export, which keeps its records between two passes) holds
	// smaller records without them. Checking them costs about what
	// decoding them does: the gain is memory. The line is still checked
	// whole: a request that is not an array of strings is refused as ever.
	NoRequests bool
	// LastRequest, with NoRequests, keeps the last step's Request: the
	// last prompt of a contiguous attempt holds every earlier one's
	// messages, and so all of its screenshots, in an eighth of the hashes
	// of every step's requests (15 steps, two messages added a step).
	LastRequest bool
	// LazyLogprobs, with a RecordText (ReadRecordsTextWith), leaves the
	// steps' logprobs that the text holds as the writers copy it
	// unparsed: such a step's Logprobs has its length but holds NaNs
	// until RecordText.ParseLogprobs. Parsing them was a sixth of a
	// contiguous export's CPU, which copies the text and never uses the
	// values. Readers without a RecordText parse them as ever.
	LazyLogprobs bool
}

// ReadRecordLinesWith is ReadRecordLines leaving out what opts say.
func ReadRecordLinesWith(r io.Reader, opts ReadOptions, fn func(rec Record, line int) error) (ReadStats, error) {
	return readRecordsText(r, parseMode{ReadOptions: opts}, func(rec Record, _ *RecordText, line int, _ int64) error { return fn(rec, line) }, MaxRecordBytes)
}

// ReadRecordsTextWith is ReadRecordsText leaving out what opts say.
func ReadRecordsTextWith(r io.Reader, opts ReadOptions, fn func(rec Record, text *RecordText, line int) error) (ReadStats, error) {
	return readRecordsText(r, parseMode{text: true, ReadOptions: opts}, func(rec Record, t *RecordText, line int, _ int64) error { return fn(rec, t, line) }, MaxRecordBytes)
}

// parseMode is how readRecordsText's workers parse a line.
type parseMode struct {
	text bool // with a RecordText
	ReadOptions
}

// ReadRunRecordsText reads dir/rollouts.jsonl with ReadRecordsText.
func ReadRunRecordsText(dir string, fn func(rec Record, text *RecordText, line int) error) (ReadStats, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	return ReadRecordsText(f, fn)
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

// ReadRunRecordsFrom is ReadRunRecordsAt starting at the byte offset from,
// which must start a line (a record's offset that ReadRunRecordsAt passed,
// say): a reader that follows a run being written reads again only from
// its last record. Offsets are the file's; line numbers count from the line
// at from.
func ReadRunRecordsFrom(dir string, from int64, fn func(rec Record, line int, off int64) error) (ReadStats, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	st, err := readRecords(io.NewSectionReader(f, from, math.MaxInt64-from), func(rec Record, line int, off int64) error {
		return fn(rec, line, from+off)
	}, MaxRecordBytes)
	if st.FirstTorn != nil {
		st.TornOffset += from
		st.FirstTorn.Offset += from
	}
	return st, err
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

// readBatchBytes and readBatchLines bound one batch of lines that a
// worker parses: large enough that handing it over costs little beside
// parsing it, small enough that a few in flight per worker stay small.
const (
	readBatchBytes = 1 << 20
	readBatchLines = 256
)

// lineKind is what readRecords makes of a line before parsing it.
type lineKind uint8

const (
	lineRecord  lineKind = iota // complete: parsed by a worker
	lineBlank                   // empty or whitespace only
	lineTooLong                 // longer than the bound, not kept
	lineNoEnd                   // the last line, without its newline
)

type batchLine struct {
	kind       lineKind
	off        int64
	start, end int // the line's bytes in the batch's data
}

// readBatch is consecutive lines of the file. A worker fills recs and
// errs (one per line; only lineRecord lines are parsed), then closes done.
type readBatch struct {
	data  []byte
	lines []batchLine
	recs  []Record
	texts []*RecordText // with the records, when the reader asked
	errs  []error
	err   error // the read error met after these lines
	done  chan struct{}
}

func (b *readBatch) parse(mode parseMode) {
	b.recs = make([]Record, len(b.lines))
	b.errs = make([]error, len(b.lines))
	if mode.text {
		b.texts = make([]*RecordText, len(b.lines))
	}
	for i, ln := range b.lines {
		switch {
		case ln.kind != lineRecord:
		case mode.text:
			b.recs[i], b.texts[i], b.errs[i] = parseRecordText(b.data[ln.start:ln.end], mode.ReadOptions)
		default:
			b.recs[i], b.errs[i] = parseRecordOpts(b.data[ln.start:ln.end], mode.ReadOptions)
		}
	}
	close(b.done)
}

// readRecords reads lines on one goroutine, parses them on one per CPU,
// and calls fn with the records on the caller's goroutine, in the file's
// order: the verdict on each line (a record, blank, torn) is made in that
// order, as one pass would make it. Parsing is most of reading a run, so
// an export, a summary or a resume reads at the speed of every core.
func readRecords(r io.Reader, fn func(Record, int, int64) error, maxLine int) (st ReadStats, err error) {
	return readRecordsText(r, parseMode{}, func(rec Record, _ *RecordText, line int, off int64) error { return fn(rec, line, off) }, maxLine)
}

// readRecordsText is readRecords giving fn each record's text too, when
// mode.text is set (nil otherwise).
func readRecordsText(r io.Reader, mode parseMode, fn func(Record, *RecordText, int, int64) error, maxLine int) (st ReadStats, err error) {
	workers := runtime.GOMAXPROCS(0)
	// One batch queued per worker keeps every worker busy while fn takes
	// the batch before. Two per worker read further ahead for no speed:
	// the batches and their records were a sixth of a fresh export's
	// memory, and each page of it first used costs a page fault.
	order := make(chan *readBatch, workers)
	work := make(chan *readBatch, workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	free := make(chan []byte, 2*workers+2)
	wg.Go(func() { readBatches(r, maxLine, order, work, free, stop) })
	for range workers {
		wg.Go(func() {
			for b := range work {
				b.parse(mode)
			}
		})
	}
	torn := func(lineErr *LineError) {
		st.TornLines++
		st.TornTail = true
		if st.FirstTorn == nil {
			st.FirstTorn = lineErr
			st.TornOffset = lineErr.Offset
		}
	}
	for b := range order {
		<-b.done
		for i, ln := range b.lines {
			st.Lines++
			at := &LineError{Line: st.Lines, Offset: ln.off}
			switch ln.kind {
			case lineTooLong:
				at.Err = fmt.Errorf("%w: line longer than %d bytes", ErrRecordTooLarge, maxLine)
				torn(at)
			case lineBlank:
				st.BlankLines++
			case lineNoEnd:
				at.Err = errNoNewline
				torn(at)
			default:
				if err := b.errs[i]; errors.Is(err, ErrSchemaVersion) {
					at.Err = err
					return st, at
				} else if err != nil {
					at.Err = err
					torn(at)
					continue
				}
				st.TornTail = false
				st.Records++
				var t *RecordText
				if mode.text {
					t, b.texts[i] = b.texts[i], nil
				}
				if err := fn(b.recs[i], t, st.Lines, at.Offset); err != nil {
					return st, err
				}
				b.recs[i] = Record{} // let fn's copy be the only one
			}
		}
		if b.err != nil {
			return st, fmt.Errorf("read records: line %d: %w", st.Lines+1, b.err)
		}
		// Nothing read from the batch refers to its data (the decoder
		// copies strings, a RecordText its text): the next batch reads
		// into it.
		if cap(b.data) == readBatchBytes {
			select {
			case free <- b.data[:0]:
			default:
			}
		}
	}
	return st, nil
}

// readBatches reads r's lines into batches and hands each to the parsers
// (work) and, in the file's order, to readRecords (order), until the end
// of r, a read error (the last batch's err) or stop. A batch reads into
// the data of one readRecords is done with (free) when there is one: a new
// MiB for each was most of what reading a run allocated, and every
// allocation brings the next collection nearer.
func readBatches(r io.Reader, maxLine int, order, work chan<- *readBatch, free <-chan []byte, stop <-chan struct{}) {
	defer close(work)
	defer close(order)
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	var off int64
	// Each batch's data is allocated once at its bound: grown line by
	// line, it was copied as it doubled, a third of an export's reading.
	// The first is small, for the many reads of short files.
	size := 64 << 10
	newBatch := func() *readBatch {
		b := &readBatch{done: make(chan struct{})}
		select {
		case b.data = <-free:
		default:
			b.data = make([]byte, 0, size)
		}
		size = readBatchBytes
		return b
	}
	b := newBatch()
	send := func() bool {
		for _, ch := range []chan<- *readBatch{order, work} {
			select {
			case ch <- b:
			case <-stop:
				return false
			}
		}
		b = newBatch()
		return true
	}
	for {
		line, n, complete, tooLong, err := readLine(br, buf[:0], maxLine)
		buf = line[:0]
		if err != nil {
			b.err = err
			send()
			return
		}
		if n == 0 {
			send()
			return
		}
		ln := batchLine{off: off}
		off += n
		switch {
		case tooLong:
			ln.kind = lineTooLong
		case len(bytes.TrimSpace(line)) == 0:
			ln.kind = lineBlank
		case !complete:
			ln.kind = lineNoEnd
		default:
			// A line that does not fit goes to the next batch, which
			// it starts (a line longer than the bound gets data of its
			// own).
			if len(b.lines) > 0 && len(b.data)+len(line) > cap(b.data) && !send() {
				return
			}
			ln.kind = lineRecord
			ln.start = len(b.data)
			b.data = append(b.data, line...)
			ln.end = len(b.data)
		}
		b.lines = append(b.lines, ln)
		if !complete {
			send()
			return
		}
		if len(b.data) >= readBatchBytes || len(b.lines) >= readBatchLines {
			if !send() {
				return
			}
		}
	}
}

// parseRecord parses one complete line. An error matching ErrSchemaVersion
// is fatal; any other means the line is unreadable.
//
// It decodes with encoding/json/v2 (the go-json-experiment module, its
// mirror until Go 1.27 has it in the standard library), twice as fast as
// encoding/json here: parsing is most of an export's first pass. Records
// are written by encoding/json, whose output v2 reads into the same values
// (TestParseRecordAgrees); v2 is stricter only with what legato never
// writes (names in another case, a name twice, invalid UTF-8).
func parseRecord(line []byte) (Record, error) {
	return parseRecordOpts(line, ReadOptions{})
}

// fastParse lets the readers parse the arrays of records' steps
// themselves (parseRecordFast); a test turns it off to compare.
var fastParse = true

// recordDecodingNoRequests is recordDecoding leaving the steps' requests
// out (ReadOptions.NoRequests).
var recordDecodingNoRequests = jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(
	jsonv2.UnmarshalFromFunc(unmarshalInt64s),
	jsonv2.UnmarshalFromFunc(unmarshalFloat64s),
	jsonv2.UnmarshalFromFunc(skipRequest),
))

// parseRecordOpts is parseRecord leaving out what opts say.
func parseRecordOpts(line []byte, opts ReadOptions) (Record, error) {
	if fastParse {
		if rec, ok := parseRecordFast(line, opts, nil); ok {
			return checkVersion(rec)
		}
	}
	if opts.NoRequests && !opts.LastRequest {
		return parseRecordWith(line, recordDecodingNoRequests)
	}
	rec, err := parseRecordWith(line, recordDecoding)
	keepLastRequest(&rec, opts)
	return rec, err
}

// keepLastRequest leaves out the requests of rec that opts leave out when
// opts keep the last: a reader that had to decode them all.
func keepLastRequest(rec *Record, opts ReadOptions) {
	if !opts.NoRequests || !opts.LastRequest {
		return
	}
	for k := range max(len(rec.Steps)-1, 0) {
		rec.Steps[k].Request = nil
	}
}

// keepsRequest says whether a reader with opts keeps the request of step
// k of n.
func keepsRequest(opts ReadOptions, k, n int) bool {
	return !opts.NoRequests || (opts.LastRequest && k == n-1)
}

// parseRecordText is parseRecord keeping the text of the record's
// logprobs.
func parseRecordText(line []byte, opts ReadOptions) (Record, *RecordText, error) {
	t := &RecordText{line: line}
	if fastParse {
		if rec, ok := parseRecordFast(line, opts, t); ok {
			rec, err := checkVersion(rec)
			if err != nil {
				return Record{}, nil, err
			}
			t.own()
			return rec, t, nil
		}
		t = &RecordText{line: line}
	}
	floats := unmarshalNumbers(parseFloat64, t.keep)
	if opts.LazyLogprobs {
		floats = t.unmarshalLazyLogprobs
	}
	unmarshalers := []*jsonv2.Unmarshalers{
		jsonv2.UnmarshalFromFunc(unmarshalInt64s),
		jsonv2.UnmarshalFromFunc(floats),
	}
	if opts.NoRequests && !opts.LastRequest {
		unmarshalers = append(unmarshalers, jsonv2.UnmarshalFromFunc(skipRequest))
	}
	rec, err := parseRecordWith(line, jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(unmarshalers...)))
	if err != nil {
		return Record{}, nil, err
	}
	keepLastRequest(&rec, opts)
	t.own()
	return rec, t, nil
}

// skipRequest checks a step's request, an array of strings, and leaves it
// undecoded; any other []string is decoded as ever.
func skipRequest(dec *jsontext.Decoder, v *[]string) error {
	p := dec.StackPointer()
	if !strings.HasPrefix(string(p), "/steps/") || p.LastToken() != "request" || strings.Count(string(p), "/") != 3 {
		return errors.ErrUnsupported
	}
	if k := dec.PeekKind(); k != '[' && k != 'n' {
		return errors.ErrUnsupported // the decoder's own error names it
	}
	raw, err := dec.ReadValue()
	if err != nil {
		return err
	}
	if !stringArray(raw) {
		return jsonv2.Unmarshal(raw, v) // for the decoder's error
	}
	return nil
}

// stringArray reports whether raw, a valid JSON value, is null or an array
// of strings and nulls (which decode as "", as the decoder has them).
func stringArray(raw []byte) bool {
	if string(raw) == "null" {
		return true
	}
	for i := 1; i < len(raw)-1; {
		switch raw[i] {
		case ' ', '\t', '\r', '\n', ',':
			i++
		case '"':
			// Valid JSON: a backslash is followed by what it escapes,
			// and the string ends.
			for i++; raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
			i++
		case 'n':
			i += len("null")
		default:
			return false
		}
	}
	return true
}

func parseRecordWith(line []byte, decoding jsonv2.Options) (Record, error) {
	var rec Record
	if err := jsonv2.Unmarshal(line, &rec, decoding); err != nil {
		return Record{}, err
	}
	return checkVersion(rec)
}

// checkVersion returns rec if its schema is Version, or why not.
func checkVersion(rec Record) (Record, error) {
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
