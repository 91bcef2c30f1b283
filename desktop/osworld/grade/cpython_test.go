package grade

// The native metrics lean on Python semantics re-implemented in Go: str()
// of JSON values, shlex.split and difflib's ratio (package pystr has the
// str methods). These tests compare them with CPython itself on the same
// inputs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/grade/pystr"
)

// cpython runs script with input as JSON on stdin and decodes its JSON
// output into out.
func cpython(t *testing.T, script string, input, out any) {
	t.Helper()
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(needPython(t), "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("python output: %v", err)
	}
}

func TestShlexSplitMatchesCPython(t *testing.T) {
	inputs := []string{
		`ls -l /tmp`,
		`  spaced   out  `,
		`echo "a b" 'c d' e\ f`,
		`a"b c"d`,
		`'' "" x`,
		`"esc \" \\ \$ \a"`,
		`'no \escape'`,
		`tab	sep` + "\n" + `newline`,
		`gsettings get org.gnome.desktop.interface text-scaling-factor`,
		`grep -q 'conda initialize' ~/.bashrc`,
		`unicode "é ü" 文字`,
		`trailing\`,
		`"unclosed`,
		`'unclosed`,
		``,
	}
	var want []*[]string
	cpython(t, `
import json, shlex, sys
out = []
for s in json.load(sys.stdin):
    try:
        out.append(shlex.split(s))
    except ValueError:
        out.append(None)
print(json.dumps(out))`, inputs, &want)
	for i, in := range inputs {
		got, err := shlexSplit(in)
		if want[i] == nil {
			if err == nil {
				t.Errorf("shlexSplit(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("shlexSplit(%q): %v, want %q", in, err, *want[i])
			continue
		}
		if got == nil {
			got = []string{}
		}
		if diff := cmp.Diff(*want[i], got); diff != "" {
			t.Errorf("shlexSplit(%q) (-python +go):\n%s", in, diff)
		}
	}
}

func TestStrMatchesCPython(t *testing.T) {
	values := []string{
		`null`, `true`, `false`, `0`, `-7`, `123456789012345678901234567890`,
		`0.0`, `-0.0`, `1.5`, `1e16`, `1e15`, `123456789.125`, `0.0001`, `0.00001`, `1e-7`, `2.5e-300`, `1.7976931348623157e308`, `1e400`,
		`""`, `"plain"`, `"it's"`, `"say \"hi\""`, `"both ' and \""`, `"back\\slash"`, `"tab\tnew\nret\r"`,
		`"\u0000\u001f\u007f\u0080\u00a0\u00ad\u00e9"`, `"\u2028\u200b\ufeff\u4e2d\ud83d\ude00"`,
		`[]`, `[1, "a", null, [true]]`, `{}`, `{"b": 1, "a": [2.0, "x"], "c": {"d": null}}`,
	}
	var want []string
	cpython(t, `import json, sys; print(json.dumps([str(json.loads(s)) for s in json.load(sys.stdin)]))`, values, &want)
	for i, in := range values {
		v, err := decodePy([]byte(in))
		if err != nil {
			t.Fatalf("decodePy(%s): %v", in, err)
		}
		if got := pyStr(v); got != want[i] {
			t.Errorf("str(%s) = %q, python gives %q", in, got, want[i])
		}
	}
}

func TestMatchRatioMatchesCPython(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	type pair struct{ A, B []string }
	var pairs []pair
	lines := func(n, alphabet int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprint("l", r.IntN(alphabet))
		}
		return out
	}
	for i := range 300 {
		// Long inputs with few distinct lines exercise the autojunk rule
		// (popular lines in b of 200 or more).
		n, m := r.IntN(30), r.IntN(30)
		if i%5 == 0 {
			n, m = 150+r.IntN(150), 200+r.IntN(150)
		}
		alphabet := 1 + r.IntN(12)
		pairs = append(pairs, pair{lines(n, alphabet), lines(m, alphabet)})
	}
	pairs = append(pairs, pair{[]string{}, []string{}}, pair{[]string{"a"}, []string{}})
	var want []float64
	cpython(t, `
import difflib, json, sys
print(json.dumps([difflib.SequenceMatcher(a=p["A"], b=p["B"]).ratio() for p in json.load(sys.stdin)]))`, pairs, &want)
	for i, p := range pairs {
		if got := matchRatio(p.A, p.B); got != want[i] {
			t.Errorf("ratio #%d (%d vs %d lines) = %v, python gives %v\na=%s\nb=%s", i, len(p.A), len(p.B), got, want[i],
				strings.Join(p.A, ","), strings.Join(p.B, ","))
		}
	}
}

// codePoints is s as a list of code points, which carries lone surrogates
// through JSON both ways.
func codePoints(s string) []rune {
	out := []rune{}
	for i := 0; i < len(s); {
		r, n := pystr.DecodeRune(s[i:])
		out = append(out, r)
		i += n
	}
	return out
}

// evalInputs are texts eval() gets from gsettings, and the Python around
// them the native eval must read as CPython does: the value, or the
// exception's type.
var evalInputs = []string{
	// What gsettings prints.
	"['thunderbird.desktop', 'org.gnome.Nautilus.desktop']\n", "@as []\n", "[]\n",
	"No such schema 'org.gnome.shell'\n", "No such key 'favorite-apps'\n", "", "\n", "  ",
	"['a.desktop']", "uint32 5", "@as",
	// Literals: quotes, prefixes, escapes, joining.
	`["a", 'b', '''c''', """d"""]`, `[u'a', U'b', r'\n', R'\'']`, `['a' "b" 'c']`, `'abc'`, `'a' 'b'`, `""`,
	`['\x41\u00e9\U0001F600\101\0\a\b\f\n\r\t\v\'\"\\']`, `['\q', '\ ']`, `['\777']`, `['\ud800']`,
	"'a\\\nb'", "['\\\r\n']", "'''a\nb'''", "'''a\r\nb'''", "'a\u2028b'", "'a\u0085b'", "'é'",
	`['\x4']`, `['\xg0']`, `['\u12']`, `['\U00110000']`, `['\U80000000']`, `['\UFFFFFFFF']`, `['\N']`, `['\N{']`, `['\N{}']`, `'a\'`, `r'\'`,
	`['a' b'b']`, `[ur'a']`, `[Ru'a']`,
	// Lists and tuples, white space, comments, continuation.
	"['a',]", "[\n'a',\n'b'\n]", "\t['a']", "\f['a']", " ['a']", "\t\t['a']", "['a'] # c", "# c\n['a']",
	"['a']\n\n", "['a']\r\n", "['a']\r", "\\\n['a']", "['a'\\\n]", "[\f'a']", "['a'\f]", "['a']\f", "\f\n['a']",
	"\r\n['a']", "\r['a']", "()", "('a',)", "('a', 'b')", "'a', 'b'", "'a',", "('a')", "(('a'),)", "[('a')]",
	"(['a'])", "('a'\n,'b')", "['a']\n  # x",
	// Not Python.
	"[,]", "['a';]", "['a'];", "['a'", "'a", "['a\nb']", "'''a", "['a'}", "x[", "'a'(", "$", "?", "!", "`a`",
	"['a'] \\", "['a'] \\\n", "\\", "\x0b['a']", "['a']\x1c", "['a']\x7f", "\u00a0['a']", "['a']\u00a0",
	"[\u3000'a']", "['a']\u2028", "[\x00]", "['a']\x00", "'a'\n'b'", "'a'\r'b'", "['a']\n['b']",
	"(,)", "[a,,b]", "f(,)", "x;", "@a", ",", "=", ":", ";", "/a", "%a", "|a", "&a", "^a", "<a", ">a", "==a", "!=a",
	"True False", "['a'] 'b'", "'a' b", "1 2", "['a'] x", "None 'a'", "['a'] ['b'] c", "'a' ('b') 'c'",
	"0x1f 'a'", "1.5e3 'a'", "1j x",
	// Indentation.
	"'a'\n  'b'", "\n['a']", "\n  ['a']", "  # c\n  ['a']", "['a']\n  ", "['a']\n\t", "\f ['a']", "\n ", "\n\n\t# c\n ", "# c\n\f\n \n['a']",
	"\n \\", "\n \\x", "\n 'a", "\n $", "\n )", "['a']\n \\", "['a']\n $", "['a']\n x y", "\n \\\n'a'",
	"['a']\n \\\n'a'", "x\n \\", "\f \\", "\f 'a", "\n \\\n", "\n \\\n ['a']",
	"['a']\n  'b", "['a']\n  ['b'] x", "x y\n  z",
}

// evalRefused are texts CPython evaluates (or may raise on in a way not
// decided here) that the native eval refuses: the package documentation
// lists them.
var evalRefused = []string{
	"['a'] + ['b']", "true", "None", "1", "[1]", "[None]", "[['a']]", "{'a'}", "...", "['a'],",
	"[b'a']", "[f'a']", "[rb'a']", `['\N{BULLET}']`, "1if 1 else 2", "['a'] ['b']", "'a' ['b']",
	"é", "[é]", "['a' for x in 'b']", "x\n  z", "1.25\n", "*a", "**a", "*a,",
}

// evalSurrogate is a text holding a lone surrogate, which eval() cannot
// encode.
var evalSurrogate = "['" + string(pystr.AppendRune(nil, 0xdc00)) + "']"

func TestEvalMatchesCPython(t *testing.T) {
	inputs := append(append([]string(nil), evalInputs...), evalSurrogate)
	inputs = append(inputs, evalRefused...)
	var cps [][]rune
	for _, s := range inputs {
		cps = append(cps, codePoints(s))
	}
	var want []struct {
		Value json.RawMessage // a str, or a list or tuple of strs, as a JSON list
		Raise string
		Other string // repr of any other value
	}
	cpython(t, `
import json, sys, warnings
warnings.simplefilter("ignore")
out = []
for cps in json.load(sys.stdin):
    try:
        v = eval("".join(map(chr, cps)))
    except BaseException as e:
        out.append({"Raise": type(e).__name__})
        continue
    if isinstance(v, str) or isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        out.append({"Value": v if isinstance(v, str) else list(v)})
    else:
        out.append({"Other": repr(v)})
print(json.dumps(out))`, cps, &want)
	for i, in := range inputs {
		got, err := pyEvalStrings(in)
		var refused *errEvalUnsupported
		if i > len(evalInputs) {
			if !errors.As(err, &refused) {
				t.Errorf("eval(%s) = %v, %v; want it refused (python: %+v)", pystr.Repr(in), pyRepr(got), err, want[i])
			}
			continue
		}
		w := want[i]
		var pe *PythonError
		switch {
		case errors.As(err, &refused):
			t.Errorf("eval(%s) refused; python gives %s%s%s", pystr.Repr(in), w.Value, w.Raise, w.Other)
		case w.Raise != "":
			if !errors.As(err, &pe) || pe.Type != w.Raise {
				t.Errorf("eval(%s) = %s, %v; python raises %s", pystr.Repr(in), pyRepr(got), err, w.Raise)
			}
		case w.Other != "":
			t.Errorf("eval(%s) = %s, %v; python gives %s: list it in evalRefused", pystr.Repr(in), pyRepr(got), err, w.Other)
		default:
			v, derr := decodePy(w.Value)
			if derr != nil {
				t.Fatalf("python's answer %s: %v", w.Value, derr)
			}
			if err != nil || !pyEqual(got, v) {
				t.Errorf("eval(%s) = %s, %v; python gives %s", pystr.Repr(in), pyRepr(got), err, pyRepr(v))
			}
		}
	}
}

func TestFloatMatchesCPython(t *testing.T) {
	texts := []string{
		"1.25\n", "1.0\n", "", " ", "1_0", "_1", "1_", "1__0", "1_.5", "1._5", "1.5_0", "1e1_0", "1e_1", "1_e1",
		"0x1p3", "0x10", "inf", "-INF", "+Infinity", "iNfInItY", "infinit", "infinityx", "nan", "-nan", "+NaN",
		"nan(1)", "in f", "\u00a01.5\u3000", "\x1c1.5\x1f", "\u0661.\u0665", "1.5\u0085", "\u20281", "1 .5", ".5",
		"5.", ".", "e5", "1e", "1e+", "1E-3", "--1", "+-1", "-+1", "+", "-", "1e400", "-1e400", "1e-400", "-0.0",
		"\U0001D7D9.5", "\u0b67", "0001.0", "1_000.000_1", "\u0661_\u0660", " \t\n\r\x0b\x0c1.0", "\u200b1",
		"1\x00", "1.0j", "\uff11.5", "'1.25'", "1\x7f", "Infinity_", "1e5.5", "1.2.3", "0.1e-0_1",
		"4.9e-324", "2.4703282292062328e-324", "1.7976931348623157e308", "1.7976931348623159e308",
		"9007199254740993", "0." + strings.Repeat("0", 400) + "1e400", strings.Repeat("9", 500),
		string(pystr.AppendRune(nil, 0xd800)) + "1",
	}
	values := []string{`null`, `true`, `false`, `0`, `-7`, `1.5`, `NaN`, `-Infinity`, `[]`, `{}`, `["1"]`,
		"1" + strings.Repeat("0", 308), "1" + strings.Repeat("0", 309),
		`179769313486231580793728971405301199252069012264752390332004544495176179865349768338004270088521` +
			`0624032996513397808095216843290925046869097283521224357484349290432690733016209064102869218305548` +
			`7939022025327016898829225813098618040838024512659806706474963396929004458216000906858389283443834` +
			`7040086080784478496694988224`, // halfway between the largest float and 2**1024: overflows
		`179769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766` +
			`8781715404589535143824642343213268894641827684675467035375169860499105765512820762454900903893289` +
			`4407586850845513394230458323690322294816580855933212334827479782620414472316873817718091929988125` +
			`0404026184124858368`} // the largest float
	var cps [][]rune
	for _, s := range texts {
		cps = append(cps, codePoints(s))
	}
	type answer struct {
		Repr  string
		Raise string
	}
	var wantTexts, wantValues []answer
	script := `
import json, sys
def conv(v):
    try:
        return {"Repr": repr(float(v))}
    except BaseException as e:
        return {"Raise": type(e).__name__}
data = json.load(sys.stdin)
print(json.dumps(%s))`
	cpython(t, fmt.Sprintf(script, `[conv("".join(map(chr, cps))) for cps in data]`), cps, &wantTexts)
	cpython(t, fmt.Sprintf(script, `[conv(json.loads(v)) for v in data]`), values, &wantValues)
	check := func(what string, v any, w answer) {
		got, err := pyFloat(v)
		var pe *PythonError
		switch {
		case w.Raise != "":
			if !errors.As(err, &pe) || pe.Type != w.Raise {
				t.Errorf("float(%s) = %v, %v; python raises %s", what, got, err, w.Raise)
			}
		case err != nil || pystr.Float(got) != w.Repr:
			t.Errorf("float(%s) = %s, %v; python gives %s", what, pystr.Float(got), err, w.Repr)
		}
	}
	for i, s := range texts {
		check(pystr.Repr(s), s, wantTexts[i])
	}
	for i, s := range values {
		v, err := decodePy([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		check(s, v, wantValues[i])
	}
}

// TestFloatErrorNamesTheText: CPython's message, with the text as given.
func TestFloatErrorNamesTheText(t *testing.T) {
	_, err := pyFloat(" No such key\n")
	if want := `raised ValueError: could not convert string to float: ' No such key\n'`; err == nil || err.Error() != want {
		t.Errorf("float error = %v, want %s", err, want)
	}
}
