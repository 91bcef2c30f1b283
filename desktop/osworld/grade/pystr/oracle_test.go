package pystr

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// The oracle is CPython itself: one python3 process per test, reading
// requests on stdin and answering on stdout (no network). Strings travel
// as lists of code points, so that lone surrogates survive both ways.
const oracleScript = `
import json, sys, unicodedata

def text(cps):
    return "".join(map(chr, cps))

def cps(s):
    return [ord(c) for c in s]

OPS = {
    "lower": lambda s: cps(s.lower()),
    "strip": lambda s: cps(s.strip()),
    "splitlines": lambda s: [cps(l) for l in s.splitlines()],
    "repr": lambda s: cps(repr(s)),
    "float": lambda s: cps(repr(float(s))),
}
print(json.dumps({"python": sys.version.split()[0], "unicode": unicodedata.unidata_version}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    op = OPS[req["op"]]
    print(json.dumps([op(text(a)) for a in req["args"]]), flush=True)
`

// pythonEnv names the interpreter tests compare with; python3 on PATH
// when unset.
const pythonEnv = "LEGATO_PYTHON"

type oracle struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	mu  sync.Mutex
}

// python returns the interpreter to compare with, skipping the test when
// there is none.
func python(t testing.TB) string {
	t.Helper()
	p := os.Getenv(pythonEnv)
	if p == "" {
		p = "python3"
	}
	path, err := exec.LookPath(p)
	if err != nil {
		t.Skipf("no %s to compare with (set %s to a CPython 3.11): %v", p, pythonEnv, err)
	}
	return path
}

// startOracle starts CPython for t. It skips the test when the interpreter
// is not the Unicode edition the tables follow: another edition answers
// differently on the characters it added, which is not a bug here.
func startOracle(t testing.TB) *oracle {
	t.Helper()
	cmd := exec.Command(python(t), "-c", oracleScript)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the CPython oracle: %v", err)
	}
	o := &oracle{cmd: cmd, in: in, out: bufio.NewScanner(outPipe)}
	o.out.Buffer(make([]byte, 1<<20), 256<<20)
	t.Cleanup(func() {
		o.in.Close()
		_ = o.cmd.Wait()
	})
	if !o.out.Scan() {
		t.Fatalf("the CPython oracle did not start: %v", o.out.Err())
	}
	var hello struct{ Python, Unicode string }
	if err := json.Unmarshal(o.out.Bytes(), &hello); err != nil {
		t.Fatal(err)
	}
	if hello.Unicode != UnicodeVersion {
		t.Skipf("python %s has Unicode %s; pystr follows CPython 3.11's Unicode %s (set %s to a CPython 3.11)",
			hello.Python, hello.Unicode, UnicodeVersion, pythonEnv)
	}
	return o
}

// codePoints turns a Go string in pystr's encoding into code points; a
// byte that is not UTF-8 cannot be sent.
func codePoints(t testing.TB, s string) []rune {
	var out []rune
	for i := 0; i < len(s); {
		r, n := DecodeRune(s[i:])
		if invalid(r, n) {
			t.Fatalf("%q is not a Python str", s)
		}
		out = append(out, r)
		i += n
	}
	if out == nil {
		out = []rune{}
	}
	return out
}

func fromCodePoints(cps []rune) string {
	var b []byte
	for _, r := range cps {
		b = AppendRune(b, r)
	}
	return string(b)
}

// call applies op to every arg in CPython and decodes the answers into out
// (a pointer to a slice).
func (o *oracle) call(t testing.TB, op string, args []string, out any) {
	t.Helper()
	req := struct {
		Op   string   `json:"op"`
		Args [][]rune `json:"args"`
	}{Op: op}
	for _, a := range args {
		req.Args = append(req.Args, codePoints(t, a))
	}
	line, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := fmt.Fprintf(o.in, "%s\n", line); err != nil {
		t.Fatalf("oracle: %v", err)
	}
	if !o.out.Scan() {
		t.Fatalf("oracle died: %v", o.out.Err())
	}
	if err := json.Unmarshal(o.out.Bytes(), out); err != nil {
		t.Fatalf("oracle answer: %v", err)
	}
}

// strings calls a str → str operation.
func (o *oracle) strings(t testing.TB, op string, args []string) []string {
	t.Helper()
	var raw [][]rune
	o.call(t, op, args, &raw)
	out := make([]string, len(raw))
	for i, cps := range raw {
		out[i] = fromCodePoints(cps)
	}
	return out
}

// lists calls a str → list of str operation.
func (o *oracle) lists(t testing.TB, op string, args []string) [][]string {
	t.Helper()
	var raw [][][]rune
	o.call(t, op, args, &raw)
	out := make([][]string, len(raw))
	for i, l := range raw {
		out[i] = []string{}
		for _, cps := range l {
			out[i] = append(out[i], fromCodePoints(cps))
		}
	}
	return out
}

// quote shows a string with its code points, surrogates included.
func quote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := DecodeRune(s[i:])
		switch {
		case invalid(r, n):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		default:
			fmt.Fprintf(&b, `\u{%x}`, r)
		}
		i += n
	}
	return `"` + b.String() + `"`
}
