package pystr

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Characters chosen for the rules they exercise; generated strings draw
// from them more often than from the whole code space.
var (
	sigmas = []rune{'Σ', 'σ', 'ς'}
	// cased letters of many scripts, and cased characters that are not
	// letters or have no case mapping (ª, Ⅰ, Ⓐ, ǅ)
	casedRunes = []rune{'A', 'z', 'Ω', 'ά', 'Я', 'ж', 'Ա', 'ⴀ', 'Ⴀ', 'Ა', 'Ꭰ', 'ꭰ', 'İ', 'ı', 'ß', 'ẞ',
		'K', 'Ω', 'Å', 'ª', 'º', 'Ⅰ', 'ⅰ', 'Ⓐ', 'ⓐ', 'ǅ', 'ᾈ', '𐐀', '𐐨', '𞤀', '𐕰', '𐖗', 'ꟶ', 'Ꟑ'}
	// case-ignorable: combining marks (U+0345 is cased too), format
	// characters, modifier letters and symbols, the word-internal
	// punctuation ' . : · ’
	ignorableRunes = []rune{'\u0300', '\u0345', '\u0301', '\u20dd', '\u00ad', '\u200b', '\u200d', '\ufeff', '\U000e0001',
		'ʰ', 'ˆ', '\u02b9', '´', '¨', '\U0001f3fb', '\'', '.', ':', '·', '’', '\u2024', '\ufe13', '\u05f4', 'ー', '\u0640'}
	// every kind of white space and line boundary, and near misses
	spaceRunes = []rune{' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x1680, 0x2000, 0x200a,
		0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0x180e, 0x200b, 0x2060, 0xfeff, 0}
	// assigned after Unicode 14: unknown to CPython 3.11, known to Go
	newerRunes = []rune{0x11f00, 0x11f41, 0x1e030, 0x1e04f, 0x1f6dc, 0x31350, 0x0cf3, 0x1123f, 0x10efd}
	// lone surrogates, which a Python str may hold
	surrogateRunes = []rune{0xd800, 0xdbff, 0xdc00, 0xdfff}
	plainRunes     = []rune("abc XYZ 0123 ,;!?-_/\"\\é中文字😀")
)

// unicodeHeavy returns a random string biased toward the characters above.
func unicodeHeavy(r *rand.Rand, maxLen int) string {
	pools := [][]rune{sigmas, casedRunes, ignorableRunes, spaceRunes, newerRunes, surrogateRunes, plainRunes}
	n := r.IntN(maxLen + 1)
	var b []byte
	for range n {
		var c rune
		switch k := r.IntN(10); {
		case k < 7:
			pool := pools[r.IntN(len(pools))]
			c = pool[r.IntN(len(pool))]
		case k < 9:
			c = rune(r.IntN(0x3000)) // the scripts with case, mostly
		default:
			c = rune(r.IntN(unicode.MaxRune + 1))
		}
		b = AppendRune(b, c)
	}
	return string(b)
}

func generated(seed uint64, n, maxLen int) []string {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	lone := string(AppendRune(nil, 0xd800))
	out := []string{"", "Σ", "ΑΣ", "ΟΔΟΣ", "ΟΔΟΣ ΟΔΟΣ", "Α'Σ", "Α\u0345Σ", "\u0345Σ", "ΑΣ\u0345", "ΑΣ\u0345Α", "ΑΣΑ",
		"ΑΣ.", "ΑΣ\u00adΒ", "İ", "İΣ", "ªΣ", "ⅠΣ", lone + "Σ", "Α" + lone + "Σ", "ΑΣ" + lone, "Α\U00011f00Σ", "\U0001e030Σ",
		" \t\n\x1c\x1f\u0085\u00a0 x \u2028\u3000", "a\r\nb\rc\n\x1dd\x1ee\u2029", "\u180e x \u200b"}
	for len(out) < n {
		out = append(out, unicodeHeavy(r, maxLen))
	}
	return out
}

// TestTablesMatchCPython checks every code point's properties against the
// interpreter: a stale tables.go, or one generated from another Python,
// fails here.
func TestTablesMatchCPython(t *testing.T) {
	startOracle(t) // skips unless the interpreter has the tables' Unicode edition
	out, err := exec.Command(python(t), filepath.Join("testdata", "props.py")).Output()
	if err != nil {
		t.Fatalf("props.py: %v", err)
	}
	var f struct {
		Lower                                     map[string][]rune
		Cased, Ignorable, Space, Lines, Printable []rune
		Decimal                                   map[string]int
	}
	if err := json.Unmarshal(out, &f); err != nil {
		t.Fatal(err)
	}
	bad := 0
	check := func(what string, c rune, got, want bool) {
		if got != want && bad < 20 {
			bad++
			t.Errorf("%s(%U) = %v, python gives %v", what, c, got, want)
		}
	}
	set := func(cs []rune) func(rune) bool {
		return func(c rune) bool { _, ok := slices.BinarySearch(cs, c); return ok }
	}
	isCased, isIgnorable, isSpace, isLine, isPrintable := set(f.Cased), set(f.Ignorable), set(f.Space), set(f.Lines), set(f.Printable)
	for c := rune(0); c <= unicode.MaxRune; c++ {
		s := string(AppendRune(nil, c))
		want := s
		if l, ok := f.Lower[strconv.Itoa(int(c))]; ok {
			want = fromCodePoints(l)
		}
		if got := Lower(s); got != want && bad < 20 {
			bad++
			t.Errorf("lower(%U) = %s, python gives %s", c, quote(got), quote(want))
		}
		check("cased", c, unicode.Is(cased, c), isCased(c))
		check("case-ignorable", c, unicode.Is(caseIgnorable, c), isIgnorable(c))
		check("isspace", c, IsSpace(c), isSpace(c))
		check("line boundary", c, len(SplitLines("a"+s+"b")) == 2, isLine(c))
		check("isprintable", c, IsPrintable(c), isPrintable(c))
		value, isDecimal := f.Decimal[strconv.Itoa(int(c))]
		if got, ok := Digit(c); (got != value || ok != isDecimal) && bad < 20 {
			bad++
			t.Errorf("Digit(%U) = %d, %v; python gives %d, %v", c, got, ok, value, isDecimal)
		}
	}
}

func TestLowerMatchesCPython(t *testing.T) {
	o := startOracle(t)
	in := generated(1, 20000, 12)
	want := o.strings(t, "lower", in)
	for i, s := range in {
		if got := Lower(s); got != want[i] {
			t.Errorf("Lower(%s) = %s, python gives %s", quote(s), quote(got), quote(want[i]))
		}
	}
}

func TestStripMatchesCPython(t *testing.T) {
	o := startOracle(t)
	in := generated(2, 5000, 8)
	want := o.strings(t, "strip", in)
	for i, s := range in {
		if got := Strip(s); got != want[i] {
			t.Errorf("Strip(%s) = %s, python gives %s", quote(s), quote(got), quote(want[i]))
		}
	}
}

func TestSplitLinesMatchesCPython(t *testing.T) {
	o := startOracle(t)
	in := generated(3, 5000, 10)
	want := o.lists(t, "splitlines", in)
	for i, s := range in {
		got := SplitLines(s)
		if got == nil {
			got = []string{}
		}
		if diff := cmp.Diff(want[i], got); diff != "" {
			t.Errorf("SplitLines(%s) (-python +go):\n%s", quote(s), diff)
		}
	}
}

func TestReprMatchesCPython(t *testing.T) {
	o := startOracle(t)
	in := append(generated(4, 5000, 8), `it's`, `say "hi"`, `both ' and "`, `back\slash`, "\x00\x1f\x7f\u0080\u00a0\u00ad")
	want := o.strings(t, "repr", in)
	for i, s := range in {
		if got := Repr(s); got != want[i] {
			t.Errorf("Repr(%s) = %s, python gives %s", quote(s), quote(got), quote(want[i]))
		}
	}
}

func TestFloatMatchesCPython(t *testing.T) {
	o := startOracle(t)
	r := rand.New(rand.NewPCG(5, 6))
	floats := []float64{0, math.Copysign(0, -1), 1, -1.5, 1e16, 1e15, 123456789.125, 1e-4, 1e-5, 1e-7, 2.5e-300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, 0.1, 1.0 / 3}
	for range 3000 {
		switch r.IntN(3) {
		case 0: // anything
			floats = append(floats, math.Float64frombits(r.Uint64()))
		case 1: // around where the notation switches
			floats = append(floats, (r.Float64()*2-1)*math.Pow(10, float64(r.IntN(40)-20)))
		default: // short decimals
			floats = append(floats, float64(r.IntN(2000000)-1000000)/math.Pow(10, float64(r.IntN(8))))
		}
	}
	var lits []string
	for _, f := range floats {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = 1
		}
		lits = append(lits, strconv.FormatFloat(f, 'e', -1, 64))
	}
	lits = append(lits, "inf", "-inf", "nan")
	want := o.strings(t, "float", lits)
	for i, lit := range lits {
		f, _ := strconv.ParseFloat(lit, 64)
		if got := Float(f); got != want[i] {
			t.Errorf("Float(%s) = %q, python gives %q", lit, got, want[i])
		}
	}
}

// TestEncodingRoundTrips checks that every code point, surrogates
// included, survives AppendRune and both decoders.
func TestEncodingRoundTrips(t *testing.T) {
	for c := rune(0); c <= unicode.MaxRune; c++ {
		s := string(AppendRune(nil, c))
		if r, n := DecodeRune(s); r != c || n != len(s) {
			t.Fatalf("DecodeRune(%U encoded) = %U, %d", c, r, n)
		}
		if r, n := DecodeLastRune("ab" + s); r != c || n != len(s) {
			t.Fatalf("DecodeLastRune(%U encoded) = %U, %d", c, r, n)
		}
	}
	// Bytes that are not UTF-8 are kept, one at a time.
	for _, s := range []string{"\xff", "\xed\xa0", "\xc0\x80", "a\x80"} {
		if got := Lower(s); got != s {
			t.Errorf("Lower(%q) = %q, want it unchanged", s, got)
		}
	}
}
