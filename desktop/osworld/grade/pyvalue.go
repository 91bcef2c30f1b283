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
//	str → string (in pystr's encoding), list → []any, dict → *pyDict
//
// Values come from json.loads (decodePy), and json.loads returns one and
// the same NaN object for every NaN it reads. Python compares container
// elements by identity first, so a NaN equals itself inside a list or dict
// (and in `in`), though `NaN == NaN` is false: pyEqual is the operator,
// pyItemEqual the element comparison.

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"

	"legato/rl/desktop/osworld/grade/pystr"
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

// pyItemEqual is how Python compares the elements of containers, and an
// item with the elements of a list in `in`: identity first, then ==.
func pyItemEqual(a, b any) bool {
	fa, aFloat := a.(float64)
	fb, bFloat := b.(float64)
	if aFloat && bFloat && math.IsNaN(fa) && math.IsNaN(fb) {
		return true // json.loads's one NaN object
	}
	return pyEqual(a, b)
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
			if !pyItemEqual(x[i], y[i]) {
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
			if !ok || !pyItemEqual(x.vals[k], yv) {
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
			if pyItemEqual(e, item) {
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
		for i := 0; i < len(x); {
			_, n := pystr.DecodeRune(x[i:])
			out = append(out, x[i:i+n])
			i += n
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
				if !pyItemEqual(x[i], y[i]) {
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
		return pystr.Float(x)
	case string:
		return pystr.Repr(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *pyDict:
		parts := make([]string, 0, x.len())
		for _, k := range x.keys {
			parts = append(parts, pystr.Repr(k)+": "+pyRepr(x.vals[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}
