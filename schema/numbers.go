package schema

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// recordDecoding decodes the arrays of numbers that make most of a record
// (every step's reply ids and logprobs) without reflection per element and
// with the slice allocated once at its length: reflection and the slice's
// doubling were two thirds of parsing a record. Anything but a flat array
// of plain numbers (null elements, a fraction in an id, an out of range
// value) is handed to the default decoding, so the values and errors are
// the ones it gives (TestParseRecordAgrees, TestNumberArrays).
var recordDecoding = jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(
	jsonv2.UnmarshalFromFunc(unmarshalInt64s),
	jsonv2.UnmarshalFromFunc(unmarshalFloat64s),
))

var (
	unmarshalInt64s   = unmarshalNumbers(parseInt64, nil)
	unmarshalFloat64s = unmarshalNumbers(parseFloat64, nil)
)

func parseFloat64(num []byte) (float64, bool) {
	// string(num) does not allocate: ParseFloat keeps no reference.
	f, err := strconv.ParseFloat(string(num), 64)
	return f, err == nil
}

// unmarshalNumbers decodes a JSON array of numbers into a []T with parse,
// handing anything parse or eachNumber refuses to the default decoding.
// keep, when set, is given each array decoded here without whitespace, its
// text and the input offset just past it.
func unmarshalNumbers[T int64 | float64](parse func(num []byte) (T, bool), keep func(v []T, raw []byte, end int64)) func(*jsontext.Decoder, *[]T) error {
	return func(dec *jsontext.Decoder, v *[]T) error {
		if dec.PeekKind() != '[' {
			return errors.ErrUnsupported
		}
		raw, err := dec.ReadValue()
		if err != nil {
			return err
		}
		return decodeNumbers(raw, dec.InputOffset(), parse, keep, v)
	}
}

// decodeNumbers is unmarshalNumbers on the array raw, which ends at input
// offset end.
func decodeNumbers[T int64 | float64](raw []byte, end int64, parse func(num []byte) (T, bool), keep func(v []T, raw []byte, end int64), v *[]T) error {
	// Commas + 1 is the count when the elements are numbers, an upper
	// bound otherwise; bytes.Count counts them many bytes at a time.
	out, plain, ok := parseNumbers(raw, bytes.Count(raw, []byte{','})+1, parse)
	if !ok {
		return jsonv2.Unmarshal(raw, v)
	}
	*v = out
	if keep != nil && plain && len(out) > 0 {
		keep(out, raw, end)
	}
	return nil
}

// parseNumbers parses the elements of the valid JSON array raw with parse
// into a slice of room n, and reports whether raw held no whitespace
// (plain) and every element was a number parse took (ok).
func parseNumbers[T int64 | float64](raw []byte, n int, parse func(num []byte) (T, bool)) (out []T, plain, ok bool) {
	out = make([]T, 0, n)
	plain, ok = eachNumber(raw, func(num []byte) bool {
		v, ok := parse(num)
		out = append(out, v)
		return ok
	})
	return out, plain, ok
}

// unmarshalLazyLogprobs decodes a step's logprobs for a RecordText that
// leaves them unparsed (ReadOptions.LazyLogprobs): an array that
// lazyNumbers accepts becomes NaNs, one per number, and its text is kept
// to parse later; any other array, and any other []float64, is decoded
// as unmarshalNumbers decodes it.
func (t *RecordText) unmarshalLazyLogprobs(dec *jsontext.Decoder, v *[]float64) error {
	if dec.PeekKind() != '[' {
		return errors.ErrUnsupported
	}
	p := dec.StackPointer()
	raw, err := dec.ReadValue()
	if err != nil {
		return err
	}
	n, lazy := lazyNumbers(raw)
	if !lazy || p.LastToken() != "logprobs" || !strings.HasPrefix(string(p), "/steps/") {
		return decodeNumbers(raw, dec.InputOffset(), parseFloat64, t.keep, v)
	}
	*v = t.keepLazy(n, raw, dec.InputOffset())
	return nil
}

// keepLazy returns n NaNs for the n numbers of raw, which ends at offset
// end of the input, and keeps raw's text to parse into them later
// (ParseLogprobs). NaN is not a value any line can hold: a writer
// formatting one before ParseLogprobs fails instead of writing a wrong
// number.
func (t *RecordText) keepLazy(n int, raw []byte, end int64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	t.keep(out, raw, end)
	t.spans[len(t.spans)-1].lazy = true
	return out
}

// lazyNumbers reports whether the valid JSON array raw holds only numbers,
// at least one, without whitespace, each of which surely parses to a
// finite float64 (numbersEnd), and how many: its text alone then says
// what a writer writes, and parsing it cannot fail.
func lazyNumbers(raw []byte) (n int, ok bool) {
	end, n, finite := numbersEnd(raw, 0)
	return n, end == len(raw) && n > 0 && finite
}

// A RecordText holds the text of a record's logprobs as its line holds
// them, for a writer to copy instead of formatting each number again:
// formatting them was a tenth of an export's CPU, with numbers shorter
// than a real server's (up to 17 significant digits). ReadRecordsText
// gives one with each record.
type RecordText struct {
	line  []byte // the record's line while it is parsed (see keep, own)
	spans []textSpan
}

// textSpan is the text of one array, between its brackets, and the slice
// decoded from it, which holds NaNs until ParseLogprobs when lazy.
type textSpan struct {
	v    []float64
	text []byte
	lazy bool
}

// keep records the text of the array decoded into v, raw, which ends at
// offset end of the input. The decoder hands out slices of its input when
// the input is a []byte (the line): the text is then the line's until own
// copies the texts.
func (t *RecordText) keep(v []float64, raw []byte, end int64) {
	var text []byte
	if start := int(end) - len(raw); start >= 0 && int(end) <= len(t.line) && &t.line[start] == &raw[0] {
		text = t.line[start+1 : end-1 : end-1]
	} else {
		text = bytes.Clone(raw[1 : len(raw)-1])
	}
	t.spans = append(t.spans, textSpan{v: v, text: text})
}

// own copies the texts into memory of t's own, allocated once at their
// size: slices of the line would keep its whole batch of lines (a MiB)
// as long as an export keeps the record.
func (t *RecordText) own() {
	n := 0
	for _, sp := range t.spans {
		n += len(sp.text)
	}
	arena := make([]byte, 0, n)
	for i := range t.spans {
		start := len(arena)
		arena = append(arena, t.spans[i].text...)
		t.spans[i].text = arena[start:len(arena):len(arena)]
	}
	t.line = nil
}

// Logprobs returns the text of the logprobs of rec's step i: the numbers
// as the record's line holds them, separated by commas, without brackets
// or whitespace, each parsing to its value in Logprobs (once
// ParseLogprobs ran, when the reader left them lazy). It is nil when
// the line held them otherwise (a null, whitespace, an empty array), when
// t is nil, and when the step's Logprobs is not the slice read with t (a
// caller replaced it). Numbers written by legato are in encoding/json's
// format, which is what a writer formatting the values writes.
func (t *RecordText) Logprobs(rec *Record, i int) []byte {
	if t == nil || i < 0 || i >= len(rec.Steps) {
		return nil
	}
	lp := rec.Steps[i].Response.Logprobs
	if len(lp) == 0 {
		return nil
	}
	match := func(sp textSpan) bool { return &sp.v[0] == &lp[0] && len(sp.v) == len(lp) }
	if i < len(t.spans) && match(t.spans[i]) { // in the line's order, usually
		return t.spans[i].text
	}
	for _, sp := range t.spans {
		if match(sp) {
			return sp.text
		}
	}
	return nil
}

// eachNumber calls fn with each element of the valid JSON array raw while
// the elements are numbers and fn returns true, and reports whether every
// element was a number that fn took (ok), and whether raw held no
// whitespace before eachNumber stopped (plain).
func eachNumber(raw []byte, fn func(num []byte) bool) (plain, ok bool) {
	plain = true
	i, end := 1, len(raw)-1
	for i < end {
		switch c := raw[i]; {
		case c == ',':
			i++
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			plain = false
			i++
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < end && isNumberByte(raw[j]) {
				j++
			}
			if !fn(raw[i:j]) {
				return plain, false
			}
			i = j
		default: // null, a string, an object, an array
			return plain, false
		}
	}
	return plain, true
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// parseInt64 parses a valid JSON number that is an integer in int64's
// range; ok is false for any other (a fraction, an exponent, overflow).
func parseInt64(num []byte) (n int64, ok bool) {
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	var u uint64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		if u > (math.MaxUint64-9)/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case !neg && u <= math.MaxInt64:
		return int64(u), true
	case neg && u <= 1<<63:
		return -int64(u), true
	}
	return 0, false
}

// ParseLogprobs parses the logprobs a reader left as text
// (ReadOptions.LazyLogprobs) into rec's steps, which hold NaNs until
// then; rec is the record read with t. A reader that uses the values, and
// not only the text, calls it first. It does nothing the second time.
func (t *RecordText) ParseLogprobs(rec *Record) error {
	if t == nil {
		return nil
	}
	for i := range t.spans {
		sp := &t.spans[i]
		if !sp.lazy {
			continue
		}
		text := sp.text
		for k := range sp.v {
			num, rest, _ := bytes.Cut(text, []byte{','})
			f, ok := parseFloat64(num)
			if !ok || (k == len(sp.v)-1) != (len(rest) == 0) {
				return fmt.Errorf("rollout %s: logprob %d (%q) does not parse as it read", rec.RolloutID, k, num)
			}
			sp.v[k], text = f, rest
		}
		sp.lazy = false
	}
	return nil
}
