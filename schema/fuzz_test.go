package schema

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func FuzzReadRecords(f *testing.F) {
	a, b := line(f, small("a")), line(f, fullRecord("b"))
	for _, seed := range []string{
		"",
		"\n",
		a + "\n",
		a + "\n" + b + "\n",
		a + "\n" + b[:len(b)/2],
		a + "\n" + b,
		"garbage\n" + a + "\n",
		"{}\nnull\n[]\n1\n\"s\"\n",
		"\r\n \t\n" + a + "\r\n",
		`{"schema":"legato.rollout/v1"}` + "\n",
		`{"schema":"legato.rollout/v0","steps":[{"request":["x"],"started_at":"bad"}]}` + "\n",
		`{"schema":"legato.rollout/v0","reward":1e999}` + "\n",
		"\x00\x00\x00",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := read(bytes.NewReader(data), MaxRecordBytes)

		// Never more records than lines; every line is accounted for.
		lines := bytes.Count(data, []byte("\n"))
		if len(data) > 0 && data[len(data)-1] != '\n' {
			lines++
		}
		st := got.Stats
		if st.Records != len(got.IDs) {
			t.Fatalf("Records = %d, callback called %d times", st.Records, len(got.IDs))
		}
		if st.Records > lines || st.Lines > lines {
			t.Fatalf("stats %+v for %d lines", st, lines)
		}
		if got.Err == "" && (st.Lines != lines || st.Records+st.BlankLines+st.TornLines != st.Lines) {
			t.Fatalf("stats %+v do not add up to %d lines", st, lines)
		}
		// Torn handling: the first torn line is located at a line start,
		// and a tail without its newline is never a record.
		if (st.TornLines > 0) != (got.TornLine > 0) {
			t.Fatalf("TornLines = %d but first torn line %d", st.TornLines, got.TornLine)
		}
		if st.TornLines > 0 && st.TornOffset > 0 && data[st.TornOffset-1] != '\n' {
			t.Fatalf("TornOffset %d is not the start of a line", st.TornOffset)
		}
		if want := lastLineTorn(data); got.Err == "" && st.TornTail != want {
			t.Fatalf("TornTail = %v, want %v", st.TornTail, want)
		}

		// The same result however the bytes arrive, and from a simple
		// reference that splits the whole input.
		if diff := cmp.Diff(got, read(iotest.OneByteReader(bytes.NewReader(data)), MaxRecordBytes)); diff != "" {
			t.Fatalf("one byte at a time (-whole +bytewise):\n%s", diff)
		}
		if diff := cmp.Diff(splitIDs(data), got.IDs); got.Err == "" && diff != "" {
			t.Fatalf("ids (-reference +got):\n%s", diff)
		}
		// A small line limit never panics and never yields a long line.
		small := read(bytes.NewReader(data), 64)
		if small.Stats.Records > st.Records+st.TornLines {
			t.Fatalf("limit 64: %d records, more than the %d lines read unlimited", small.Stats.Records, st.Records+st.TornLines)
		}
	})
}

// splitIDs is the reference reader: split on newlines, keep complete lines
// that parse.
func splitIDs(data []byte) []string {
	var ids []string
	parts := bytes.Split(data, []byte("\n"))
	for i, p := range parts {
		if i == len(parts)-1 {
			break // no newline after it: torn or empty
		}
		if rec, err := parseRecord(p); err == nil {
			ids = append(ids, rec.RolloutID)
		}
	}
	return ids
}

// lastLineTorn reports whether the last non-blank line of data is not a
// record.
func lastLineTorn(data []byte) bool {
	parts := bytes.Split(data, []byte("\n"))
	for i := len(parts) - 1; i >= 0; i-- {
		if len(bytes.TrimSpace(parts[i])) == 0 {
			continue
		}
		if i == len(parts)-1 {
			return true
		}
		_, err := parseRecord(parts[i])
		return err != nil && !errors.Is(err, ErrSchemaVersion)
	}
	return false
}
