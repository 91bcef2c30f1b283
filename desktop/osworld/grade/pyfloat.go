package grade

import (
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"

	"legato/rl/desktop/osworld/grade/pystr"
)

// pyFloat is float(v) for the values a getter or a rule can give.
func pyFloat(v any) (float64, error) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case *big.Int:
		// Rounded to nearest, ties to even, as CPython rounds an int; one
		// that rounds past the largest float overflows.
		f, _ := new(big.Float).SetInt(x).Float64()
		if math.IsInf(f, 0) {
			return 0, raise("OverflowError", "int too large to convert to float")
		}
		return f, nil
	case string:
		if f, ok := parseFloatText(x); ok {
			return f, nil
		}
		return 0, raise("ValueError", "could not convert string to float: %s", pystr.Repr(x))
	}
	return 0, raise("TypeError", "float() argument must be a string or a real number, not '%s'", pyTypeName(v))
}

// parseFloatText is float() of a str, as CPython 3.11 reads one: every
// character outside ASCII that is white space becomes a space and every
// decimal digit (Arabic-Indic, fullwidth, ...) its ASCII digit, anything
// else there fails; then ASCII white space (space, \t, \n, \v, \f, \r, not
// the separators \x1c-\x1f) is stripped from both ends, and what remains
// must be a decimal number with an optional sign and exponent, where an
// underscore may stand only between two digits, or "inf", "infinity" or
// "nan" in any case with an optional sign. No hexadecimal, no inner space.
func parseFloatText(s string) (float64, bool) {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		r, n := pystr.DecodeRune(s[i:])
		i += n
		switch d, isDigit := pystr.Digit(r); {
		case r < 0x7f:
			b = append(b, byte(r))
		case pystr.IsSpace(r):
			b = append(b, ' ')
		case isDigit:
			b = append(b, byte('0'+d))
		default:
			return 0, false
		}
	}
	t := strings.Trim(string(b), " \t\n\v\f\r")
	body := strings.TrimLeft(t, "+-")
	if len(t)-len(body) > 1 {
		return 0, false
	}
	switch strings.ToLower(body) {
	case "inf", "infinity":
		return math.Copysign(math.Inf(1), sign(t)), true
	case "nan":
		return math.NaN(), true
	}
	digits, ok := dropUnderscores(t)
	if !ok || !isDecimalNumber(digits) {
		return 0, false
	}
	f, err := strconv.ParseFloat(digits, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return f, true // out of range is ±inf or ±0, as CPython gives
}

func sign(t string) float64 {
	if strings.HasPrefix(t, "-") {
		return -1
	}
	return 1
}

// dropUnderscores removes the underscores of s, each of which must stand
// between two ASCII digits.
func dropUnderscores(s string) (string, bool) {
	if !strings.Contains(s, "_") {
		return s, true
	}
	isDigit := func(i int) bool { return i >= 0 && i < len(s) && s[i] >= '0' && s[i] <= '9' }
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '_' {
			if !isDigit(i-1) || !isDigit(i+1) {
				return "", false
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), true
}

// isDecimalNumber reports whether s is [+-](digits[.digits?] | .digits)
// ([eE][+-]digits)?, all ASCII: what strconv.ParseFloat then reads with
// CPython's rounding (it would also take hexadecimal and "Inf", which
// CPython's float() refuses or reads above).
func isDecimalNumber(s string) bool {
	i := 0
	digits := func() int {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - start
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	n := digits()
	if i < len(s) && s[i] == '.' {
		i++
		n += digits()
	}
	if n == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}
