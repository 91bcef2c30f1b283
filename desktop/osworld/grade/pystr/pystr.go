// Package pystr gives Go strings the semantics of the CPython 3.11 str
// operations OSWorld's metrics use: lower, isspace and strip, splitlines,
// isprintable and repr, the value of a decimal digit, and str() of a
// float. Go's strings and unicode packages differ from them:
// strings.ToLower maps a final capital sigma to σ where Python gives ς,
// Go's tables are a newer Unicode edition than Python 3.11's 14.0.0,
// unicode.IsSpace misses four ASCII separators.
//
// The character properties (tables.go) are read from CPython 3.11 itself by
// gen_tables.go; the rules that look at more than one character (the final
// sigma, \r\n) are written here after CPython's unicodeobject.c.
//
// A Python str is held in a Go string as UTF-8, extended to the surrogate
// code points U+D800–U+DFFF that a Python str may hold (a JSON "\ud800"
// escape makes one): they are encoded like any other three-byte code point.
// Bytes that are not UTF-8, which no Python str holds, are kept as they are
// and count as characters with no property.
package pystr

import (
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// caseRange maps the code points of [lo, hi] at a multiple of stride from
// lo to themselves plus delta.
type caseRange struct {
	lo, hi rune
	stride rune
	delta  rune
}

const (
	capitalSigma = 'Σ'
	smallSigma   = 'σ'
	finalSigma   = 'ς'
)

// DecodeRune is utf8.DecodeRuneInString that also decodes encoded
// surrogates. A byte that starts no encoding gives (utf8.RuneError, 1).
func DecodeRune(s string) (rune, int) {
	if len(s) >= 3 && s[0] == 0xED && s[1] >= 0xA0 && s[1] <= 0xBF && s[2]&0xC0 == 0x80 {
		return 0xD000 | rune(s[1]&0x3F)<<6 | rune(s[2]&0x3F), 3
	}
	return utf8.DecodeRuneInString(s)
}

// DecodeLastRune is DecodeRune from the end of s.
func DecodeLastRune(s string) (rune, int) {
	if n := len(s); n >= 3 && s[n-3] == 0xED && s[n-2] >= 0xA0 && s[n-2] <= 0xBF && s[n-1]&0xC0 == 0x80 {
		return DecodeRune(s[n-3:])
	}
	return utf8.DecodeLastRuneInString(s)
}

// AppendRune appends the encoding of r, surrogates included.
func AppendRune(b []byte, r rune) []byte {
	if r >= 0xD800 && r <= 0xDFFF {
		return append(b, 0xED, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return utf8.AppendRune(b, r)
}

// invalid reports whether a decoded (r, size) is a byte that is not UTF-8.
func invalid(r rune, size int) bool { return r == utf8.RuneError && size == 1 }

// Lower is str.lower(): the full lowercase mapping of every character
// (İ becomes two), and a capital sigma in final position (after a cased
// letter, not before one, case-ignorable characters skipped) becomes ς.
// Locale-dependent rules (Turkish, Lithuanian) do not apply, as in Python.
func Lower(s string) string {
	var b []byte
	for i := 0; i < len(s); {
		r, n := DecodeRune(s[i:])
		if r < utf8.RuneSelf && (r < 'A' || r > 'Z') || invalid(r, n) {
			if b != nil {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		var low string
		switch special, ok := lowerSpecial(r); {
		case r == capitalSigma && isFinalSigma(s, i, n):
			low = string(finalSigma)
		case r == capitalSigma:
			low = string(smallSigma)
		case ok:
			low = special
		default:
			l := lowerRune(r)
			if l == r {
				if b != nil {
					b = append(b, s[i:i+n]...)
				}
				i += n
				continue
			}
			low = string(AppendRune(nil, l))
		}
		if b == nil {
			b = append(make([]byte, 0, len(s)+4), s[:i]...)
		}
		b = append(b, low...)
		i += n
	}
	if b == nil {
		return s
	}
	return string(b)
}

// lowerRune is the simple lowercase mapping of r.
func lowerRune(r rune) rune {
	lo, hi := 0, len(lowerRanges)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch c := lowerRanges[m]; {
		case r < c.lo:
			hi = m
		case r > c.hi:
			lo = m + 1
		default:
			if (r-c.lo)%c.stride == 0 {
				return r + c.delta
			}
			return r
		}
	}
	return r
}

// isFinalSigma reports whether the capital sigma at s[i:i+n] is in the
// Final_Sigma context: \p{cased}\p{case-ignorable}* Σ not followed by
// \p{case-ignorable}*\p{cased}. As in CPython, a character that is both
// cased and case-ignorable is skipped.
func isFinalSigma(s string, i, n int) bool {
	before := s[:i]
	for {
		r, size := DecodeLastRune(before)
		if size == 0 {
			return false // nothing cased before
		}
		if invalid(r, size) {
			return false
		}
		if unicode.Is(caseIgnorable, r) {
			before = before[:len(before)-size]
			continue
		}
		if !unicode.Is(cased, r) {
			return false
		}
		break
	}
	after := s[i+n:]
	for {
		r, size := DecodeRune(after)
		if size == 0 {
			return true
		}
		if invalid(r, size) {
			return true
		}
		if unicode.Is(caseIgnorable, r) {
			after = after[size:]
			continue
		}
		return !unicode.Is(cased, r)
	}
}

// IsSpace is str.isspace() for one character: the ASCII white space and
// separators \x1c-\x1f, and every character whose bidirectional type is
// WS, B or S or whose category is Zs.
func IsSpace(r rune) bool { return unicode.Is(whiteSpace, r) }

// Strip is str.strip() with no argument.
func Strip(s string) string {
	for len(s) > 0 {
		r, n := DecodeRune(s)
		if invalid(r, n) || !IsSpace(r) {
			break
		}
		s = s[n:]
	}
	for len(s) > 0 {
		r, n := DecodeLastRune(s)
		if invalid(r, n) || !IsSpace(r) {
			break
		}
		s = s[:len(s)-n]
	}
	return s
}

// Digit is the value of a decimal digit (str.isdecimal(): ASCII digits
// and the other characters of category Nd), as int() and float() read it.
func Digit(r rune) (int, bool) {
	for _, rg := range decimal.R16 {
		if r >= rune(rg.Lo) && r <= rune(rg.Hi) {
			return int(r-rune(rg.Lo)) % 10, true
		}
	}
	for _, rg := range decimal.R32 {
		if r >= rune(rg.Lo) && r <= rune(rg.Hi) {
			return int(r-rune(rg.Lo)) % 10, true
		}
	}
	return 0, false
}

// SplitLines is str.splitlines(): lines end at \n, \r, \r\n, \v, \f,
// \x1c-\x1e, U+0085, U+2028 and U+2029; the text after the last boundary is
// a line when it is not empty.
func SplitLines(s string) []string {
	var lines []string
	start := 0
	for i := 0; i < len(s); {
		r, n := DecodeRune(s[i:])
		if invalid(r, n) || !unicode.Is(lineBoundary, r) {
			i += n
			continue
		}
		lines = append(lines, s[start:i])
		i += n
		if r == '\r' && i < len(s) && s[i] == '\n' {
			i++
		}
		start = i
	}
	if start < len(s) {
		lines = append(lines, s[start:])
	}
	return lines
}

// IsPrintable is str.isprintable() for one character: false for the
// categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than the space.
func IsPrintable(r rune) bool { return unicode.Is(printable, r) }

// Repr is repr() of a str: in single quotes unless the text holds a single
// quote and no double quote, with \\, the quote, \t, \n and \r escaped,
// and every other character that is not printable written as \xhh, \uhhhh
// or \Uhhhhhhhh.
func Repr(s string) string {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	const hex = "0123456789abcdef"
	b := make([]byte, 0, len(s)+2)
	b = append(b, quote)
	for i := 0; i < len(s); {
		r, n := DecodeRune(s[i:])
		switch {
		case invalid(r, n):
			b = append(b, s[i]) // not a Python str: kept
		case r == rune(quote) || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\r':
			b = append(b, `\r`...)
		case IsPrintable(r):
			b = append(b, s[i:i+n]...)
		case r <= 0xFF:
			b = append(b, '\\', 'x', hex[r>>4], hex[r&0xF])
		case r <= 0xFFFF:
			b = append(b, '\\', 'u')
			for shift := 12; shift >= 0; shift -= 4 {
				b = append(b, hex[r>>shift&0xF])
			}
		default:
			b = append(b, '\\', 'U')
			for shift := 28; shift >= 0; shift -= 4 {
				b = append(b, hex[r>>shift&0xF])
			}
		}
		i += n
	}
	return string(append(b, quote))
}

// Float is repr() and str() of a float: the shortest digits that read back
// as f, positional when the decimal exponent is in [-5, 16) (with ".0" on
// whole numbers), else in exponent notation with at least two exponent
// digits; "inf", "-inf" and "nan".
func Float(f float64) string {
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
