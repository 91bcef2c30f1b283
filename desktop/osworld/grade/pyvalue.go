package grade

// OSWorld's metrics are Python functions applied to values decoded from task
// JSON (rules, options) or produced by getters (command output, file paths).
// To give the same score natively, the Go metrics below operate on the same
// values with Python's semantics: ints and floats compare by value and
// True == 1, dicts keep insertion order (it shows in str()), `in` means
// substring, membership or key lookup depending on the container, and
// unsupported operations raise the TypeError Python would.
//
// The value model:
//
//	None → nil, bool → bool, int → *big.Int, float → float64,
//	str → string, list → []any, dict → *pyDict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// pyDict is a Python dict with string keys, in insertion order.
type pyDict struct {
	keys []string
	vals map[string]any
}

func newPyDict() *pyDict { return &pyDict{vals: map[string]any{}} }

// set assigns like Python: a repeated key keeps its first position and takes
// the new value (what json.loads does with duplicate keys).
func (d *pyDict) set(k string, v any) {
	if _, ok := d.vals[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.vals[k] = v
}

// get is dict.get(k) without a default.
func (d *pyDict) get(k string) (any, bool) {
	if d == nil {
		return nil, false
	}
	v, ok := d.vals[k]
	return v, ok
}

// getOr is dict.get(k, def).
func (d *pyDict) getOr(k string, def any) any {
	if v, ok := d.get(k); ok {
		return v
	}
	return def
}

func (d *pyDict) len() int {
	if d == nil {
		return 0
	}
	return len(d.keys)
}

// raise returns the exception Python would raise.
func raise(typ, format string, args ...any) error {
	return &PythonError{Type: typ, Message: fmt.Sprintf(format, args...)}
}

// decodePy decodes JSON the way Python's json.loads does, keeping dict order
// and the int/float distinction.
func decodePy(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodePyValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("extra data after the JSON value")
	}
	return v, nil
}

func decodePyValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodePyValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return list, nil
		case '{':
			d := newPyDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key %v is not a string", kt)
				}
				v, err := decodePyValue(dec)
				if err != nil {
					return nil, err
				}
				d.set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return d, nil
		}
		return nil, fmt.Errorf("unexpected delimiter %v", t)
	case json.Number:
		return pyNumber(string(t))
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// pyNumber converts a JSON number literal as Python's json module does: a
// literal with a fraction or exponent is a float, any other is an int of
// arbitrary size.
func pyNumber(lit string) (any, error) {
	if strings.ContainsAny(lit, ".eE") {
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, err
		}
		return f, nil // out of range gives ±Inf or 0, as float() does
	}
	n, ok := new(big.Int).SetString(lit, 10)
	if !ok {
		return nil, fmt.Errorf("bad integer %q", lit)
	}
	return n, nil
}

func pyTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case *pyDict:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}

// pyTruthy is bool(v).
func pyTruthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case *big.Int:
		return x.Sign() != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case *pyDict:
		return x.len() > 0
	}
	return true
}

// pyRat returns a number (bool, int or finite float) as an exact rational.
func pyRat(v any) (*big.Rat, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return big.NewRat(1, 1), true
		}
		return new(big.Rat), true
	case *big.Int:
		return new(big.Rat).SetInt(x), true
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return nil, false
		}
		return new(big.Rat).SetFloat64(x), true
	}
	return nil, false
}

func isPyNumber(v any) bool {
	switch v.(type) {
	case bool, *big.Int, float64:
		return true
	}
	return false
}

// pyEqual is a == b.
func pyEqual(a, b any) bool {
	if isPyNumber(a) && isPyNumber(b) {
		fa, aFloat := a.(float64)
		fb, bFloat := b.(float64)
		if aFloat && bFloat {
			return fa == fb
		}
		// int and float compare exactly in Python, not through float
		// conversion; infinities and NaN equal no int.
		ra, okA := pyRat(a)
		rb, okB := pyRat(b)
		return okA && okB && ra.Cmp(rb) == 0
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !pyEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case *pyDict:
		y, ok := b.(*pyDict)
		if !ok || x.len() != y.len() {
			return false
		}
		for _, k := range x.keys {
			yv, ok := y.get(k)
			if !ok || !pyEqual(x.vals[k], yv) {
				return false
			}
		}
		return true
	}
	return false
}

// pyContains is item in container.
func pyContains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, raise("TypeError", "'in <string>' requires string as left operand, not %s", pyTypeName(item))
		}
		return strings.Contains(c, s), nil
	case []any:
		for _, e := range c {
			if pyEqual(e, item) {
				return true, nil
			}
		}
		return false, nil
	case *pyDict:
		switch k := item.(type) {
		case []any, *pyDict:
			return false, raise("TypeError", "unhashable type: '%s'", pyTypeName(item))
		case string:
			_, ok := c.get(k)
			return ok, nil
		}
		return false, nil // JSON keys are strings; no other key equals one
	}
	return false, raise("TypeError", "argument of type '%s' is not iterable", pyTypeName(container))
}

// pyIter is list(v) for the iterables JSON can hold.
func pyIter(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case *pyDict:
		out := make([]any, 0, x.len())
		for _, k := range x.keys {
			out = append(out, k)
		}
		return out, nil
	}
	return nil, raise("TypeError", "'%s' object is not iterable", pyTypeName(v))
}

// pyLess is a < b.
func pyLess(a, b any) (bool, error) {
	if isPyNumber(a) && isPyNumber(b) {
		fa, aFloat := a.(float64)
		fb, bFloat := b.(float64)
		if aFloat && bFloat {
			return fa < fb, nil
		}
		ra, okA := pyRat(a)
		rb, okB := pyRat(b)
		if okA && okB {
			return ra.Cmp(rb) < 0, nil
		}
		// One side is an infinity or NaN float, the other an exact number.
		if aFloat {
			return fa < 0 && math.IsInf(fa, -1), nil
		}
		return fb > 0 && math.IsInf(fb, 1), nil
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return x < y, nil // byte order of UTF-8 is code point order
		}
	case []any:
		if y, ok := b.([]any); ok {
			for i := 0; i < len(x) && i < len(y); i++ {
				if !pyEqual(x[i], y[i]) {
					return pyLess(x[i], y[i])
				}
			}
			return len(x) < len(y), nil
		}
	}
	return false, raise("TypeError", "'<' not supported between instances of '%s' and '%s'", pyTypeName(a), pyTypeName(b))
}

// pySorted is sorted(v).
func pySorted(v any) ([]any, error) {
	items, err := pyIter(v)
	if err != nil {
		return nil, err
	}
	out := append([]any(nil), items...)
	var cmpErr error
	sort.SliceStable(out, func(i, j int) bool {
		less, err := pyLess(out[i], out[j])
		if err != nil && cmpErr == nil {
			cmpErr = err
		}
		return less
	})
	if cmpErr != nil {
		return nil, cmpErr
	}
	return out, nil
}

// pyStr is str(v).
func pyStr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyRepr(v)
}

// pyRepr is repr(v).
func pyRepr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case *big.Int:
		return x.String()
	case float64:
		return pyFloatRepr(x)
	case string:
		return pyStrRepr(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *pyDict:
		parts := make([]string, 0, x.len())
		for _, k := range x.keys {
			parts = append(parts, pyStrRepr(k)+": "+pyRepr(x.vals[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// pyFloatRepr formats like Python's repr(float): the shortest digits that
// round-trip, in positional notation when the decimal exponent is in
// [-5, 16), with ".0" on whole numbers, else in exponent notation.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}

// pyStrRepr is repr(str): single quotes unless the text has a single quote
// and no double quote, and escapes for what str.isprintable rejects.
func pyStrRepr(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == ' ' || (r < utf8.RuneSelf && r >= 0x20 && r != 0x7f):
			b.WriteRune(r)
		case r < utf8.RuneSelf || !unicode.IsPrint(r):
			switch {
			case r <= 0xff:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// pyLower is str.lower(). Go's simple case mapping matches Python's full
// mapping except for U+0130, which Python lowers to two code points.
func pyLower(s string) string {
	return strings.ToLower(strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

// pyIsSpace is str.isspace() for one character: Go's unicode.IsSpace plus
// the four ASCII separators Python also counts.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// pyStrip is str.strip().
func pyStrip(s string) string { return strings.TrimFunc(s, pyIsSpace) }

// pySplitLines is str.splitlines().
func pySplitLines(s string) []string {
	var lines []string
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			lines = append(lines, s[start:i])
			i += size
			start = i
			continue
		case '\r':
			lines = append(lines, s[start:i])
			i += size
			if i < len(s) && s[i] == '\n' {
				i++
			}
			start = i
			continue
		}
		i += size
	}
	if start < len(s) {
		lines = append(lines, s[start:])
	}
	return lines
}
