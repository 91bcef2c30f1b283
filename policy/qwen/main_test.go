package qwen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pythonExe finds the interpreter behind python3 once: version-manager
// shims (pyenv) take a second to start, the interpreter a tenth of that.
var pythonExe = sync.OnceValues(func() (string, error) {
	p, err := exec.LookPath("python3")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(p, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", err
	}
	if exe := strings.TrimSpace(string(out)); exe != "" {
		return exe, nil
	}
	return p, nil
})

// python returns the python3 the tests run the stub checks with.
func python(t testing.TB) string {
	t.Helper()
	p, err := pythonExe()
	if err != nil {
		t.Fatalf("python3 not found: the generated pyautogui code is checked by running it against a stub; install python3 (>= 3.8): %v", err)
	}
	return p
}

// stubEnv is the environment the stub pyautogui runs in.
func stubEnv(t testing.TB) []string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "stub"))
	if err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1")
}

// stubCall is one call the stub pyautogui recorded.
type stubCall struct {
	Fn     string         `json:"fn"`
	Args   []any          `json:"args"`
	Kwargs map[string]any `json:"kwargs"`
}

// stubCalls returns what prog should make the stub record, with numbers as
// JSON decodes them.
func stubCalls(t testing.TB, prog program) []stubCall {
	t.Helper()
	calls := make([]stubCall, 0, len(prog))
	for _, c := range prog {
		kw := map[string]any{}
		for _, k := range c.Kwargs {
			kw[k.Name] = k.Value
		}
		args := c.Args
		if args == nil {
			args = []any{}
		}
		calls = append(calls, stubCall{Fn: c.Fn, Args: args, Kwargs: kw})
	}
	js, err := json.Marshal(calls)
	if err != nil {
		t.Fatal(err)
	}
	var out []stubCall
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// runGuest runs code the way OSWorld's guest does (python -c "import
// pyautogui; ...; <code>"), against the stub, and returns the calls it
// recorded. Any violation the stub detects, or any error, fails the test.
func runGuest(t *testing.T, code string) []stubCall {
	t.Helper()
	cmd := exec.Command(python(t), "-c", "import pyautogui\nimport time\n"+code)
	cmd.Env = stubEnv(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3 -c <code> failed: %v\nstderr: %s\ncode:\n%s", err, stderr.String(), truncate(code, 500))
	}
	var calls []stubCall
	if err := json.Unmarshal(stdout.Bytes(), &calls); err != nil {
		t.Fatalf("stub output %q: %v", truncate(stdout.String(), 200), err)
	}
	return calls
}

// checker is a running "check.py serve": it checks the shape of programs
// (only pyautogui.<allowed>(<literals>) calls, as Python's own parser sees
// them) and runs them against the stub, without starting a process each.
type checker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// checkResult is the checker's verdict on one program.
type checkResult struct {
	OK    bool       `json:"ok"`
	Error string     `json:"error"`
	Calls []stubCall `json:"calls"`
}

// startChecker starts a checker that the test's cleanup stops.
func startChecker(t testing.TB) *checker {
	t.Helper()
	cmd := exec.Command(python(t), filepath.Join("testdata", "stub", "check.py"), "serve")
	cmd.Env = stubEnv(t)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start check.py serve: %v", err)
	}
	t.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("check.py serve: %v", err)
		}
	})
	return &checker{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// check sends one program and returns the verdict.
func (c *checker) check(code string) (checkResult, error) {
	req, err := json.Marshal(map[string]string{"code": code})
	if err != nil {
		return checkResult{}, err
	}
	if _, err := c.in.Write(append(req, '\n')); err != nil {
		return checkResult{}, fmt.Errorf("write to checker: %w", err)
	}
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		return checkResult{}, fmt.Errorf("read from checker: %w", err)
	}
	var res checkResult
	if err := json.Unmarshal(line, &res); err != nil {
		return checkResult{}, fmt.Errorf("checker answered %q: %w", truncate(string(line), 200), err)
	}
	return res, nil
}

// checkShape fails the test unless code has the shape of a generated
// program and runs cleanly against the stub in the checker too.
func checkShape(t *testing.T, c *checker, code string) {
	t.Helper()
	res, err := c.check(code)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("shape check: %s\ncode:\n%s", res.Error, truncate(code, 500))
	}
}

// typed returns the text a program types: typewrite text, and a line
// break for each Enter.
func typed(calls []stubCall) string {
	var b strings.Builder
	for _, c := range calls {
		switch {
		case (c.Fn == "typewrite" || c.Fn == "write") && len(c.Args) == 1:
			s, _ := c.Args[0].(string)
			b.WriteString(s)
		case c.Fn == "press" && len(c.Args) == 1 && c.Args[0] == "enter":
			b.WriteByte('\n')
		default:
			b.WriteString("<" + c.Fn + ">")
		}
	}
	return b.String()
}
