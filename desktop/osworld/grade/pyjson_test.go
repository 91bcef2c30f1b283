package grade

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"legato/rl/desktop/osworld/grade/pystr"
)

// jsonString writes s (in pystr's encoding) as a JSON string literal,
// escaping what JSON requires and lone surrogates.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, n := pystr.DecodeRune(s[i:])
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || (r >= 0xD800 && r <= 0xDFFF):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	b.WriteByte('"')
	return b.String()
}

// jsonGen writes random JSON texts in the forms json.loads meets: odd
// white space, escapes of every kind, surrogate pairs and lone halves,
// repeated keys, the NaN and Infinity constants, numbers at the edges of
// int and float, deep nesting; and, mutated, texts that are not JSON.
type jsonGen struct{ r *rand.Rand }

func (g jsonGen) ws() string {
	return []string{"", "", " ", "\n", "\t \r", "\u00a0", "\x0b"}[g.r.IntN(7)]
}

func (g jsonGen) str() string {
	var b strings.Builder
	b.WriteByte('"')
	for range g.r.IntN(6) {
		switch g.r.IntN(12) {
		case 0:
			b.WriteString([]string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`}[g.r.IntN(8)])
		case 1:
			fmt.Fprintf(&b, `\u%04X`, g.r.IntN(0x10000))
		case 2: // a pair, or a half of one
			hi, lo := 0xD800+g.r.IntN(0x400), 0xDC00+g.r.IntN(0x400)
			switch g.r.IntN(4) {
			case 0:
				fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			case 1:
				fmt.Fprintf(&b, `\u%04x`, hi)
			case 2:
				fmt.Fprintf(&b, `\u%04x`, lo)
			default:
				fmt.Fprintf(&b, `\u%04x\u%04x`, lo, hi)
			}
		case 3:
			b.WriteString([]string{"é", "Σ", "中", "😀", "\u2028", "\u00a0"}[g.r.IntN(6)])
		default:
			b.WriteByte("abc 'xyz"[g.r.IntN(8)])
		}
	}
	b.WriteByte('"')
	return b.String()
}

func (g jsonGen) number() string {
	switch g.r.IntN(8) {
	case 0:
		return []string{"0", "-0", "1", "-7", "0.5", "-0.0", "1e5", "1E+5", "2.5e-3", "1e400", "-1e400", "1e-400"}[g.r.IntN(12)]
	case 1:
		return strings.Repeat("9", 4299+g.r.IntN(3)) // around the int digit limit
	case 2:
		return "-" + strings.Repeat("1", 4299+g.r.IntN(3))
	case 3:
		return strings.Repeat("7", 30) + "." + strings.Repeat("3", 40)
	case 4:
		return []string{"NaN", "Infinity", "-Infinity"}[g.r.IntN(3)]
	}
	return fmt.Sprint(g.r.IntN(2000)-1000) + []string{"", ".25", "e2", "e-2", ".5E+3"}[g.r.IntN(5)]
}

func (g jsonGen) value(depth int) string {
	k := g.r.IntN(10)
	if depth > 3 {
		k = 5 + k/2
	}
	switch {
	case k == 0:
		n := g.r.IntN(4)
		items := make([]string, n)
		for i := range items {
			items[i] = g.ws() + g.value(depth+1) + g.ws()
		}
		return "[" + strings.Join(items, ",") + "]"
	case k == 1:
		n := g.r.IntN(4)
		items := make([]string, n)
		for i := range items {
			key := g.str()
			if g.r.IntN(3) == 0 {
				key = `"k"` // repeated keys
			}
			items[i] = g.ws() + key + g.ws() + ":" + g.ws() + g.value(depth+1) + g.ws()
		}
		return "{" + strings.Join(items, ",") + "}"
	case k < 5:
		return g.str()
	case k < 8:
		return g.number()
	}
	return []string{"null", "true", "false"}[g.r.IntN(3)]
}

// text returns a JSON text, mutated one time in four.
func (g jsonGen) text() string {
	s := g.ws() + g.value(0) + g.ws()
	if g.r.IntN(10) == 0 {
		// Either side of where CPython's recursion gives up; the limit
		// itself depends on the caller's stack (see maxJSONDepth).
		n := []int{980, 984, 1000, 1004}[g.r.IntN(4)]
		s = strings.Repeat("[", n) + strings.Repeat("]", n)
	}
	if g.r.IntN(4) == 0 && len(s) > 0 {
		i := g.r.IntN(len(s))
		switch g.r.IntN(3) {
		case 0:
			s = s[:i]
		case 1:
			s = s[:i] + string(`[]{},:"\x0`[g.r.IntN(10)]) + s[i:]
		default:
			s = s[:i] + s[i+1:]
		}
	}
	return strings.ToValidUTF8(s, "?")
}

// TestDecodePyMatchesCPython compares decodePy with json.loads on
// generated texts: the repr() of the value, which shows every type and the
// order of dicts, or the exception raised.
func TestDecodePyMatchesCPython(t *testing.T) {
	g := jsonGen{rand.New(rand.NewPCG(11, 12))}
	texts := []string{"", " ", "1 2", "[1,]", `{"a":1,}`, `{"a" 1}`, "\ufeff1", `"\ud800\u0041"`, `"\ud800\udc00"`, `"\udc00\ud800"`,
		`"\ud800"`, `"\ud800\u"`, `"\ud800\uZZZZ"`, "1.", "1e", "-", "-Infinity", "-Inf", "nan", "NaNx", "01", `"a` + "\x01" + `"`,
		`{"k": 1, "j": 2, "k": 3}`, "[" + strings.Repeat("9", 4300) + "]", "[" + strings.Repeat("9", 4301) + "]"}
	for range 3000 {
		texts = append(texts, g.text())
	}
	var want []string
	cpython(t, `
import json, sys
out = []
for s in json.load(sys.stdin):
    try:
        out.append(repr(json.loads(s)))
    except Exception as e:
        out.append("raise " + type(e).__name__)
print(json.dumps(out))`, texts, &want)
	for i, s := range texts {
		got := "raise "
		v, err := decodePy([]byte(s))
		if pe, ok := err.(*PythonError); ok {
			got += pe.Type
		} else if err != nil {
			got += err.Error()
		} else {
			got = pyRepr(v)
		}
		if got != want[i] {
			t.Errorf("json.loads(%.200q): native %.200s, python %.200s", s, got, want[i])
		}
	}
}
