package grade

// The native metrics lean on Python semantics re-implemented in Go: str()
// of JSON values, shlex.split and difflib's ratio (package pystr has the
// str methods). These tests compare them with CPython itself on the same
// inputs.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
