package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func line(t testing.TB, rec *Record) string {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func small(id string) *Record {
	return &Record{Schema: Version, RolloutID: id, Status: StatusOK, Steps: []Step{}}
}

// readResult is what a test compares after reading a stream.
type readResult struct {
	IDs        []string
	Stats      ReadStats
	TornLine   int
	TornReason string
	// Inside is the line of TornInside; 0 when it is nil.
	Inside int
	Err    string
}

func read(r io.Reader, max int) readResult {
	var res readResult
	st, err := readRecords(r, func(rec Record, _ int, _ int64) error { res.IDs = append(res.IDs, rec.RolloutID); return nil }, max)
	if in := st.TornInside(); in != nil {
		res.Inside = in.Line
	}
	if st.FirstTorn != nil {
		res.TornLine = st.FirstTorn.Line
		res.TornReason = st.FirstTorn.Err.Error()
		st.FirstTorn = nil
	}
	res.Stats = st
	if err != nil {
		res.Err = err.Error()
	}
	return res
}

func TestReadRecords(t *testing.T) {
	a, b := line(t, small("a")), line(t, small("b"))
	big := small("big")
	big.Steps = []Step{{Response: Response{Content: strings.Repeat("x", 1<<20)}}}
	bigLine := line(t, big)
	tests := []struct {
		name  string
		input string
		max   int
		want  readResult
	}{
		{
			name:  "empty",
			input: "",
			want:  readResult{},
		},
		{
			name:  "records",
			input: a + "\n" + b + "\n",
			want:  readResult{IDs: []string{"a", "b"}, Stats: ReadStats{Records: 2, Lines: 2}},
		},
		{
			name:  "torn tail",
			input: a + "\n" + b[:20],
			want: readResult{IDs: []string{"a"}, TornLine: 2, TornReason: errNoNewline.Error(),
				Stats: ReadStats{Records: 1, Lines: 2, TornLines: 1, TornTail: true, TornOffset: int64(len(a) + 1)}},
		},
		{
			// Its Append never returned: the newline is part of the write.
			name:  "whole record without its newline",
			input: a + "\n" + b,
			want: readResult{IDs: []string{"a"}, TornLine: 2, TornReason: errNoNewline.Error(),
				Stats: ReadStats{Records: 1, Lines: 2, TornLines: 1, TornTail: true, TornOffset: int64(len(a) + 1)}},
		},
		{
			name:  "unparseable last line",
			input: a + "\n" + `{"schema":"legato.rollout/v0",` + "\n",
			want: readResult{IDs: []string{"a"}, TornLine: 2, TornReason: "jsontext: unexpected EOF after offset 30",
				Stats: ReadStats{Records: 1, Lines: 2, TornLines: 1, TornTail: true, TornOffset: int64(len(a) + 1)}},
		},
		{
			name:  "corrupt line in the middle",
			input: "garbage\n" + a + "\n" + b + "\n",
			want: readResult{IDs: []string{"a", "b"}, TornLine: 1, Inside: 1, TornReason: "jsontext: invalid character 'g' at start of value",
				Stats: ReadStats{Records: 2, Lines: 3, TornLines: 1}},
		},
		{
			name:  "not legato records",
			input: "{}\n" + "null\n" + a + "\n",
			want: readResult{IDs: []string{"a"}, TornLine: 1, Inside: 1, TornReason: errNoSchema.Error(),
				Stats: ReadStats{Records: 1, Lines: 3, TornLines: 2}},
		},
		{
			name:  "corrupt line in the middle and a torn tail",
			input: a + "\nxx\n" + b + "\n" + a[:20],
			want: readResult{IDs: []string{"a", "b"}, TornLine: 2, Inside: 2, TornReason: "jsontext: invalid character 'x' at start of value",
				Stats: ReadStats{Records: 2, Lines: 4, TornLines: 2, TornTail: true, TornOffset: int64(len(a) + 1)}},
		},
		{
			name:  "blank lines and CRLF",
			input: "\n" + a + "\r\n \t\n" + b + "\n\n",
			want:  readResult{IDs: []string{"a", "b"}, Stats: ReadStats{Records: 2, Lines: 5, BlankLines: 3}},
		},
		{
			name:  "blank lines after a torn line",
			input: a + "\nxx\n\n  ",
			want: readResult{IDs: []string{"a"}, TornLine: 2, TornReason: "jsontext: invalid character 'x' at start of value",
				Stats: ReadStats{Records: 1, Lines: 4, BlankLines: 2, TornLines: 1, TornTail: true, TornOffset: int64(len(a) + 1)}},
		},
		{
			name:  "line longer than the bufio buffer",
			input: a + "\n" + bigLine + "\n" + b + "\n",
			want:  readResult{IDs: []string{"a", "big", "b"}, Stats: ReadStats{Records: 3, Lines: 3}},
		},
		{
			name:  "line longer than the limit",
			input: a + "\n" + bigLine + "\n" + b + "\n",
			max:   1 << 10,
			want: readResult{IDs: []string{"a", "b"}, TornLine: 2, Inside: 2, TornReason: "record too large: line longer than 1024 bytes",
				Stats: ReadStats{Records: 2, Lines: 3, TornLines: 1, TornOffset: int64(len(a) + 1)}},
		},
		{
			name:  "other schema version",
			input: a + "\n" + `{"schema":"legato.rollout/v1","rollout_id":"new"}` + "\n" + b + "\n",
			want: readResult{IDs: []string{"a"}, Stats: ReadStats{Records: 1, Lines: 2},
				Err: `rollouts.jsonl line 2 (offset ` + itoa(len(a)+1) + `): unsupported record schema "legato.rollout/v1": this legato reads "legato.rollout/v0"`},
		},
	}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"data+EOF": func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
	}
	for _, tt := range tests {
		for rname, reader := range readers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				max := tt.max
				if max == 0 {
					max = MaxRecordBytes
				}
				got := read(reader(tt.input), max)
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
			})
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestReadRecordsStopsOnCallbackError(t *testing.T) {
	errStop := errors.New("stop")
	in := line(t, small("a")) + "\n" + line(t, small("b")) + "\n"
	calls := 0
	st, err := ReadRecords(strings.NewReader(in), func(Record) error { calls++; return errStop })
	if err != errStop {
		t.Errorf("error = %v, want the callback's error unchanged", err)
	}
	if calls != 1 || st.Records != 1 {
		t.Errorf("calls = %d, Records = %d; want 1, 1", calls, st.Records)
	}
}

func TestReadRecordsReaderError(t *testing.T) {
	errDisk := errors.New("disk gone")
	r := io.MultiReader(strings.NewReader(line(t, small("a"))+"\n"), iotest.ErrReader(errDisk))
	st, err := ReadRecords(r, func(Record) error { return nil })
	if !errors.Is(err, errDisk) {
		t.Errorf("error = %v, want %v", err, errDisk)
	}
	if st.Records != 1 {
		t.Errorf("Records = %d, want 1", st.Records)
	}
}

func TestReadRunRecordsMissing(t *testing.T) {
	_, err := ReadRunRecords(filepath.Join(t.TempDir(), "nope"), func(Record) error { return nil })
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error = %v, want fs.ErrNotExist", err)
	}
}

// TestReadRunRecordsTornTail is the deterministic twin of the kill test: a
// run whose last Append was cut short by a crash.
func TestReadRunRecordsTornTail(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	var want []Record
	for _, id := range []string{"a", "b", "c"} {
		rec := fullRecord(id)
		if err := r.Append(rec); err != nil {
			t.Fatal(err)
		}
		want = append(want, *rec)
	}
	torn := line(t, fullRecord("d"))
	torn = torn[:len(torn)/2]
	appendRaw(t, dir, torn)

	got, st := readAll(t, dir)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if st.FirstTorn == nil || st.FirstTorn.Line != 4 || !errors.Is(st.FirstTorn, errNoNewline) {
		t.Errorf("FirstTorn = %v, want line 4: %v", st.FirstTorn, errNoNewline)
	}
	st.FirstTorn = nil
	var full bytes.Buffer
	for _, rec := range want {
		full.WriteString(line(t, &rec) + "\n")
	}
	wantStats := ReadStats{Records: 3, Lines: 4, TornLines: 1, TornTail: true, TornOffset: int64(full.Len())}
	if diff := cmp.Diff(wantStats, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}
