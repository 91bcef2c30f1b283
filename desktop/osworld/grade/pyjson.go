package grade

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"

	"legato/rl/desktop/osworld/grade/pystr"
)

// Limits of CPython 3.11's json.loads that the native decoder reproduces.
const (
	// maxIntDigits is sys.get_int_max_str_digits(): int() of a longer
	// literal raises ValueError.
	maxIntDigits = 4300
	// maxJSONDepth approximates where json.loads raises RecursionError: its
	// scanner shares the interpreter's recursion limit (1000) with the
	// Python frames of whoever called it, so the depth at which CPython
	// gives up is 1000 less the caller's stack (about 990 for a metric).
	maxJSONDepth = 990
)

// decodePy decodes JSON text as Python's json.loads does, into the value
// model of pyvalue.go: dicts keep their order (a repeated key keeps its
// first place and takes its last value), an integer literal is an int of
// any size and a literal with a fraction or exponent a float, the
// constants NaN, Infinity and -Infinity are accepted, and a "\ud800"
// escape that is not half of a pair is a lone surrogate in the string.
// Its errors are what Python raises: JSONDecodeError, ValueError (an
// integer longer than 4300 digits), RecursionError.
func decodePy(data []byte) (any, error) {
	d := &pyDecoder{s: data}
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.i != len(d.s) {
		return nil, d.fail("Extra data", d.i)
	}
	return v, nil
}

type pyDecoder struct {
	s []byte
	i int
}

// fail is JSONDecodeError's "msg: line L column C (char P)", positions in
// characters as Python counts them.
func (d *pyDecoder) fail(msg string, at int) error {
	line, col, char := 1, 1, 0
	for i := 0; i < at && i < len(d.s); {
		r, n := pystr.DecodeRune(string(d.s[i:min(i+4, len(d.s))]))
		if r == '\n' {
			line, col = line+1, 0
		}
		col++
		char++
		i += n
	}
	return &PythonError{Type: "JSONDecodeError", Message: fmt.Sprintf("%s: line %d column %d (char %d)", msg, line, col, char)}
}

// skipSpace skips JSON's white space: only these four, not Python's.
func (d *pyDecoder) skipSpace() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *pyDecoder) literal(word string) bool {
	if len(d.s)-d.i >= len(word) && string(d.s[d.i:d.i+len(word)]) == word {
		d.i += len(word)
		return true
	}
	return false
}

// value decodes the value at d.i, which is not white space.
func (d *pyDecoder) value(depth int) (any, error) {
	if d.i >= len(d.s) {
		return nil, d.fail("Expecting value", d.i)
	}
	switch c := d.s[d.i]; {
	case c == '"':
		return d.str()
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return nil, &PythonError{Type: "RecursionError", Message: "maximum recursion depth exceeded while decoding a JSON document"}
		}
		if c == '{' {
			return d.object(depth + 1)
		}
		return d.array(depth + 1)
	case d.literal("null"):
		return nil, nil
	case d.literal("true"):
		return true, nil
	case d.literal("false"):
		return false, nil
	case d.literal("NaN"):
		return math.NaN(), nil
	case d.literal("Infinity"):
		return math.Inf(1), nil
	case d.literal("-Infinity"):
		return math.Inf(-1), nil
	}
	return d.number()
}

// number matches -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? at d.i. A
// '.' or an exponent marker not followed by digits is left for the caller
// (and is then extra data, or a missing delimiter).
func (d *pyDecoder) number() (any, error) {
	start, i := d.i, d.i
	digits := func() int {
		n := 0
		for i < len(d.s) && d.s[i] >= '0' && d.s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(d.s) && d.s[i] == '-' {
		i++
	}
	switch {
	case i < len(d.s) && d.s[i] >= '1' && d.s[i] <= '9':
		digits()
	case i < len(d.s) && d.s[i] == '0':
		i++
	default:
		return nil, d.fail("Expecting value", start)
	}
	isFloat := false
	if i+1 < len(d.s) && d.s[i] == '.' && d.s[i+1] >= '0' && d.s[i+1] <= '9' {
		i++
		digits()
		isFloat = true
	}
	if i < len(d.s) && (d.s[i] == 'e' || d.s[i] == 'E') {
		mark := i
		i++
		if i < len(d.s) && (d.s[i] == '+' || d.s[i] == '-') {
			i++
		}
		if digits() == 0 {
			i = mark
		} else {
			isFloat = true
		}
	}
	d.i = i
	lit := string(d.s[start:i])
	if isFloat {
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, d.fail("Expecting value", start)
		}
		return f, nil // out of range is ±inf or ±0, as float() gives
	}
	if n := len(lit) - boolInt(lit[0] == '-'); n > maxIntDigits {
		return nil, &PythonError{Type: "ValueError", Message: fmt.Sprintf(
			"Exceeds the limit (%d digits) for integer string conversion: value has %d digits; use sys.set_int_max_str_digits() to increase the limit",
			maxIntDigits, n)}
	}
	n, _ := new(big.Int).SetString(lit, 10)
	return n, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// str decodes the string whose opening quote is at d.i.
func (d *pyDecoder) str() (string, error) {
	start := d.i
	d.i++
	var b []byte
	for {
		if d.i >= len(d.s) {
			return "", d.fail("Unterminated string starting at", start)
		}
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return string(b), nil
		case c < 0x20:
			return "", d.fail("Invalid control character at", d.i)
		case c != '\\':
			b = append(b, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.s) {
			return "", d.fail("Unterminated string starting at", start)
		}
		esc := d.s[d.i+1]
		switch esc {
		case '"', '\\', '/':
			b = append(b, esc)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := d.hex4(d.i + 2)
			if !ok {
				return "", d.fail("Invalid \\uXXXX escape", d.i+1)
			}
			d.i += 6
			// A high surrogate joins the low one escaped right after it;
			// any other surrogate stays alone. CPython looks for the pair
			// only when a character follows it.
			if r >= 0xD800 && r <= 0xDBFF && d.i+6 < len(d.s) && d.s[d.i] == '\\' && d.s[d.i+1] == 'u' {
				low, ok := d.hex4(d.i + 2)
				if !ok {
					return "", d.fail("Invalid \\uXXXX escape", d.i+1)
				}
				if low >= 0xDC00 && low <= 0xDFFF {
					r = 0x10000 + (r-0xD800)<<10 + (low - 0xDC00)
					d.i += 6
				}
			}
			b = pystr.AppendRune(b, r)
			continue
		default:
			return "", d.fail("Invalid \\escape", d.i)
		}
		d.i += 2
	}
}

func (d *pyDecoder) hex4(at int) (rune, bool) {
	if at+4 > len(d.s) {
		return 0, false
	}
	var r rune
	for _, c := range d.s[at : at+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return r, true
}

func (d *pyDecoder) object(depth int) (any, error) {
	obj := newPyDict()
	d.i++
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == '}' {
		d.i++
		return obj, nil
	}
	for {
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return nil, d.fail("Expecting property name enclosed in double quotes", d.i)
		}
		key, err := d.str()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != ':' {
			return nil, d.fail("Expecting ':' delimiter", d.i)
		}
		d.i++
		d.skipSpace()
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		obj.set(key, v)
		d.skipSpace()
		if d.i < len(d.s) && d.s[d.i] == '}' {
			d.i++
			return obj, nil
		}
		if d.i >= len(d.s) || d.s[d.i] != ',' {
			return nil, d.fail("Expecting ',' delimiter", d.i)
		}
		d.i++
		d.skipSpace()
	}
}

func (d *pyDecoder) array(depth int) (any, error) {
	list := []any{}
	d.i++
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == ']' {
		d.i++
		return list, nil
	}
	for {
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
		d.skipSpace()
		if d.i < len(d.s) && d.s[d.i] == ']' {
			d.i++
			return list, nil
		}
		if d.i >= len(d.s) || d.s[d.i] != ',' {
			return nil, d.fail("Expecting ',' delimiter", d.i)
		}
		d.i++
		d.skipSpace()
	}
}
