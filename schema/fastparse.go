package schema

import (
	jsonv2 "github.com/go-json-experiment/json"
)

// The arrays of a record's steps (each prompt's message hashes and token
// chunk hashes, each reply's token ids and logprobs) are four fifths of
// its line. Through the decoder, each byte of them was checked by its
// tokenizer, then read again by the unmarshalers that build the slices:
// parsing records was four tenths of a fresh contiguous export's CPU.
//
// parseRecordFast reads those arrays itself, checking each one against
// JSON's grammar as it builds its slice, and hands the rest of the line,
// with null in their places, to the decoder: every other byte, the
// structure around the arrays included, is checked and decoded as before.
// It reads only the arrays legato writes, in the form it writes them (no
// whitespace between tokens, strings without escapes, plain numbers); on
// anything else it returns ok false and the caller parses the line with
// the decoder alone, whose result, or error, is then the reader's. So the
// records it returns are the decoder's (TestParseFastAgrees,
// FuzzParseFast).
//
// The rest is decoded with recordDecoding, not with the unmarshalers a
// reader's options add (skipRequest, a RecordText's): that is right while
// the arrays read here are the only ones those apply to. A new []float64
// or request field in a step must be read here too.

// hotField is an array of a step that parseRecordFast reads itself.
type hotField uint8

const (
	hotRequest hotField = iota
	hotChunks
	hotTokenIDs
	hotLogprobs
)

// hotArray is one array read: its step, its field and its bytes in the
// line, brackets included.
type hotArray struct {
	step       int
	field      hotField
	start, end int
	n          int  // its elements
	finite     bool // numbers each surely finite (numbersEnd)
}

// fastScan walks a record's line, copying what the decoder is to read
// into rest and noting the arrays it reads itself.
type fastScan struct {
	line []byte
	i    int // the next byte of line to read
	last int // line[last:i] is not copied into rest yet
	rest []byte
	hot  []hotArray
	step int // the index of the step being read
}

// scope is the object whose members a fastScan reads.
type scope uint8

const (
	scopeRecord scope = iota
	scopeStep
	scopeResponse
)

// parseRecordFast parses line as parseRecordText (t set, its line line)
// or parseRecordOpts (t nil) would, or returns ok false when it cannot
// vouch for the result (t may then hold part of a record's text). It does
// not check the schema version.
func parseRecordFast(line []byte, opts ReadOptions, t *RecordText) (rec Record, ok bool) {
	s := fastScan{line: line, rest: make([]byte, 0, len(line)/4+64)}
	if !s.object(scopeRecord) || s.i != len(line) {
		return Record{}, false
	}
	s.rest = append(s.rest, line[s.last:]...)
	if err := jsonv2.Unmarshal(s.rest, &rec, recordDecoding); err != nil {
		return Record{}, false
	}
	for _, h := range s.hot {
		if h.step >= len(rec.Steps) {
			return Record{}, false
		}
		st := &rec.Steps[h.step]
		raw := line[h.start:h.end]
		switch h.field {
		case hotRequest:
			if keepsRequest(opts, h.step, len(rec.Steps)) {
				st.Request = parseStrings(raw, h.n)
			}
		case hotChunks:
			st.PromptTokenChunks = parseStrings(raw, h.n)
		case hotTokenIDs:
			ids, _, ok := parseNumbers(raw, h.n, parseInt64)
			if !ok {
				return Record{}, false
			}
			st.Response.TokenIDs = ids
		case hotLogprobs:
			lps, ok := t.fastLogprobs(raw, h, opts)
			if !ok {
				return Record{}, false
			}
			st.Response.Logprobs = lps
		}
	}
	return rec, true
}

// object reads an object of scope sc at s.i.
func (s *fastScan) object(sc scope) bool {
	if !s.byte('{') {
		return false
	}
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		name, ok := s.name()
		if !ok || !s.byte(':') {
			return false
		}
		if !s.member(sc, name) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// member reads the value of member name of an object of scope sc.
func (s *fastScan) member(sc scope, name []byte) bool {
	open := s.peek()
	switch {
	case sc == scopeRecord && string(name) == "steps" && open == '[':
		return s.steps()
	case sc == scopeStep && string(name) == "response" && open == '{':
		return s.object(scopeResponse)
	case sc == scopeStep && string(name) == "request" && open == '[':
		end, n := stringsEnd(s.line, s.i)
		return s.hotArray(hotArray{field: hotRequest, end: end, n: n})
	case sc == scopeStep && string(name) == "prompt_token_chunks" && open == '[':
		end, n := stringsEnd(s.line, s.i)
		return s.hotArray(hotArray{field: hotChunks, end: end, n: n})
	case sc == scopeResponse && string(name) == "token_ids" && open == '[':
		end, n, _ := numbersEnd(s.line, s.i)
		return s.hotArray(hotArray{field: hotTokenIDs, end: end, n: n})
	case sc == scopeResponse && string(name) == "logprobs" && open == '[':
		end, n, finite := numbersEnd(s.line, s.i)
		return s.hotArray(hotArray{field: hotLogprobs, end: end, n: n, finite: finite})
	}
	return s.skip()
}

// steps reads the steps array.
func (s *fastScan) steps() bool {
	s.i++ // [
	if s.peek() == ']' {
		s.i++
		return true
	}
	for s.step = 0; ; s.step++ {
		if s.peek() != '{' || !s.object(scopeStep) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// hotArray notes h, the array at s.i that stringsEnd or numbersEnd took
// (h.end < 0: neither did), and writes null in its place in rest.
func (s *fastScan) hotArray(h hotArray) bool {
	if h.end < 0 {
		return false
	}
	h.step, h.start = s.step, s.i
	s.rest = append(s.rest, s.line[s.last:s.i]...)
	s.rest = append(s.rest, "null"...)
	s.hot = append(s.hot, h)
	s.i, s.last = h.end, h.end
	return true
}

// name reads a member name without escapes and returns it.
func (s *fastScan) name() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.line) {
		switch c := s.line[s.i]; {
		case c == '"':
			s.i++
			return s.line[start : s.i-1], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
		s.i++
	}
	return nil, false
}

// skip goes past the value at s.i, which the decoder checks in rest:
// strings, with their escapes, and nested arrays and objects are followed
// only far enough to find where the value ends.
func (s *fastScan) skip() bool {
	depth := 0
	for s.i < len(s.line) {
		switch s.line[s.i] {
		case '"':
			s.i++
			for s.i < len(s.line) && s.line[s.i] != '"' {
				if s.line[s.i] == '\\' {
					s.i++
				}
				s.i++
			}
			if s.i >= len(s.line) {
				return false
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return true
			}
			depth--
		case ',':
			if depth == 0 {
				return true
			}
		case ' ', '\t', '\r', '\n':
			if depth == 0 {
				return false // whitespace between tokens: the decoder's
			}
		}
		s.i++
	}
	return false
}

func (s *fastScan) peek() byte {
	if s.i < len(s.line) {
		return s.line[s.i]
	}
	return 0
}

func (s *fastScan) byte(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// stringsEnd returns the index past the array of strings at b[i], each
// of plainByte, and how many it holds; end is -1 for any other array.
func stringsEnd(b []byte, i int) (end, n int) {
	i++ // [
	if i < len(b) && b[i] == ']' {
		return i + 1, 0
	}
	for i < len(b) {
		if b[i] != '"' {
			return -1, 0
		}
		for i++; i < len(b) && b[i] != '"'; i++ {
			if !plainByte(b[i]) {
				return -1, 0
			}
		}
		if i+1 >= len(b) {
			return -1, 0
		}
		n++
		switch b[i+1] {
		case ',':
			i += 2
		case ']':
			return i + 2, n
		default:
			return -1, 0
		}
	}
	return -1, 0
}

// plainByte reports whether c stands for itself in a JSON string: printable
// ASCII, neither a quote nor a backslash. A string of them decodes to its
// bytes.
func plainByte(c byte) bool { return 0x20 <= c && c <= 0x7e && c != '"' && c != '\\' }

// numbersEnd returns the index past the array of JSON numbers at b[i], how
// many it holds, and whether each surely parses to a finite float64: its
// integer digits plus its exponent are at most 308, so it is below 10^308
// (one that may be out of range is left to be parsed, for the decoder's
// error). end is -1 for any other array.
func numbersEnd(b []byte, i int) (end, n int, finite bool) {
	i++ // [
	if i < len(b) && b[i] == ']' {
		return i + 1, 0, true
	}
	finite = true
	for {
		var intDigits, exp int
		i, intDigits, exp = numberEnd(b, i)
		if i < 0 || i >= len(b) {
			return -1, 0, false
		}
		n++
		finite = finite && intDigits+exp <= 308
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, n, finite
		default:
			return -1, 0, false
		}
	}
}

// numberEnd returns the index past the JSON number at b[i] (RFC 8259:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), or -1, with how many
// digits its integer part has and its exponent (its size held below
// 100,000).
func numberEnd(b []byte, i int) (end, intDigits, exp int) {
	digits := func(i int) int {
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	start := i
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(i)
	default:
		return -1, 0, 0
	}
	intDigits = i - start
	if i < len(b) && b[i] == '.' {
		frac := i + 1
		if i = digits(frac); i == frac {
			return -1, 0, 0
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := i < len(b) && b[i] == '-'
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		first := i
		if i = digits(first); i == first {
			return -1, 0, 0
		}
		for _, c := range b[first:i] {
			if exp < 10_000 {
				exp = exp*10 + int(c-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	return i, intDigits, exp
}

// parseStrings returns the n strings of raw, an array stringsEnd took.
func parseStrings(raw []byte, n int) []string {
	// Not nil when empty: the decoder makes [] an empty slice.
	out := make([]string, 0, n)
	body := raw[1 : len(raw)-1]
	for len(body) > 0 {
		// "...",  or "..." at the end; no string holds a quote.
		end := 1
		for body[end] != '"' {
			end++
		}
		out = append(out, string(body[1:end]))
		body = body[min(end+2, len(body)):]
	}
	return out
}

// fastLogprobs parses h's array raw, which numbersEnd took, as
// parseRecordText's unmarshalers would (t set), or as parseRecordOpts's
// (t nil): ok is false when a number is out of float64's range, which the
// decoder refuses.
func (t *RecordText) fastLogprobs(raw []byte, h hotArray, opts ReadOptions) ([]float64, bool) {
	if t != nil && opts.LazyLogprobs && h.n > 0 && h.finite {
		return t.keepLazy(h.n, raw, int64(h.end)), true
	}
	out, _, ok := parseNumbers(raw, h.n, parseFloat64)
	if !ok {
		return nil, false
	}
	if t != nil && len(out) > 0 {
		t.keep(out, raw, int64(h.end))
	}
	return out, true
}
