package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// runMainEnv makes the test binary run main instead of the tests, so a test
// can check the real process: its exit status and its output.
const runMainEnv = "LEGATO_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	// A race-built process sleeps a second before it exits (GORACE's
	// atexit_sleep_ms, 1000 by default) for reports other goroutines are
	// still writing. The tests run this binary as legato in dozens of
	// child processes (TestPythonClient stops a dozen), each paying that
	// second; the children inherit this and exit at once, unless the
	// caller's GORACE says otherwise.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		if err := os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0")); err != nil {
			fmt.Fprintln(os.Stderr, "set GORACE:", err)
			os.Exit(2)
		}
	}
	goleak.VerifyTestMain(m)
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func TestDispatch(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		// wantStdout names a golden file under testdata/, or is empty when
		// nothing must be written to stdout.
		wantStdout string
		// wantStderr must each appear on stderr; stderr must be empty when
		// there are none.
		wantStderr []string
	}{
		{name: "rl help", args: []string{"rl", "help"}, wantCode: 0, wantStdout: "help.golden"},
		{name: "rl -h", args: []string{"rl", "-h"}, wantCode: 0, wantStdout: "help.golden"},
		{name: "rl --help", args: []string{"rl", "--help"}, wantCode: 0, wantStdout: "help.golden"},
		{name: "--help", args: []string{"--help"}, wantCode: 0, wantStdout: "help.golden"},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: "help.golden"},
		{name: "help of collect", args: []string{"rl", "help", "collect"}, wantCode: 0, wantStdout: "help-collect.golden"},
		{name: "help of probe", args: []string{"rl", "help", "probe"}, wantCode: 0, wantStdout: "help-probe.golden"},
		{name: "help of grader", args: []string{"rl", "help", "grader"}, wantCode: 0, wantStdout: "help-grader.golden"},
		{name: "help of export", args: []string{"rl", "help", "export"}, wantCode: 0, wantStdout: "help-export.golden"},
		{name: "help of profile", args: []string{"rl", "help", "profile"}, wantCode: 0, wantStdout: "help-profile.golden"},
		{name: "help of repair", args: []string{"rl", "help", "repair"}, wantCode: 0, wantStdout: "help-repair.golden"},
		{name: "help of gc", args: []string{"rl", "help", "gc"}, wantCode: 0, wantStdout: "help-gc.golden"},
		{name: "help of host-agent", args: []string{"rl", "help", "host-agent"}, wantCode: 0, wantStdout: "help-host-agent.golden"},
		{name: "host-agent with a relative fork dir", args: []string{"rl", "host-agent", "--fork-dir", "shm"}, wantCode: 2,
			wantStderr: []string{`legato rl host-agent: fork dir "shm": want an absolute path`}},
		{name: "host-agent with a bad vm prefix", args: []string{"rl", "host-agent", "--vm-prefix", "../x"}, wantCode: 2,
			wantStderr: []string{`name prefix "../x"`}},
		{name: "help of bench", args: []string{"rl", "help", "bench"}, wantCode: 0, wantStdout: "help-bench.golden"},
		{name: "help of view", args: []string{"rl", "help", "view"}, wantCode: 0, wantStdout: "help-view.golden"},
		{name: "help of serve-policy", args: []string{"rl", "help", "serve-policy"}, wantCode: 0, wantStdout: "help-serve-policy.golden"},
		{name: "help of help", args: []string{"rl", "help", "help"}, wantCode: 0, wantStdout: "help-help.golden"},
		{name: "no command", args: nil, wantCode: 2,
			wantStderr: []string{"Subcommands:", "legato: missing command", "Run 'legato rl help'"}},
		{name: "no subcommand", args: []string{"rl"}, wantCode: 2,
			wantStderr: []string{"Subcommands:", "legato rl: missing subcommand"}},
		{name: "unknown command", args: []string{"collect"}, wantCode: 2,
			wantStderr: []string{`legato: unknown command "collect"`, `under "legato rl"`}},
		{name: "unknown subcommand", args: []string{"rl", "colect", "--tasks", "x"}, wantCode: 2,
			wantStderr: []string{`legato rl: unknown subcommand "colect"`, "probe, collect, serve, grader, tasks, replay, regrade, export, repair, profile, view, hosts, host-agent, gc, bench, serve-policy, help", "Run 'legato rl help'"}},
		{name: "help of an unknown subcommand", args: []string{"rl", "help", "frob"}, wantCode: 2,
			wantStderr: []string{`unknown subcommand "frob"`}},
		{name: "help of two subcommands", args: []string{"rl", "help", "probe", "export"}, wantCode: 2,
			wantStderr: []string{"want at most one subcommand"}},
		{name: "probe without a server", args: []string{"rl", "probe"}, wantCode: 2, wantStderr: []string{"legato rl probe: --policy-url URL is required"}},
		{name: "collect without --out", args: []string{"rl", "collect", "--tasks", "t.json"}, wantCode: 2, wantStderr: []string{"legato rl collect: --out DIR is required"}},
		{name: "export without --out", args: []string{"rl", "export", "runs/x"}, wantCode: 2, wantStderr: []string{"legato rl export:", "--out FILE"}},
		{name: "repair without a run", args: []string{"rl", "repair"}, wantCode: 2, wantStderr: []string{"legato rl repair: missing run directory"}},
		{name: "view without a run", args: []string{"rl", "view"}, wantCode: 2, wantStderr: []string{"legato rl view: missing run directory"}},
		{name: "view of no run", args: []string{"rl", "view", "runs/x"}, wantCode: 2, wantStderr: []string{"legato rl view: runs/x: not a run directory: no rollouts.jsonl"}},
		{name: "view beyond loopback", args: []string{"rl", "view", "runs/x", "--addr", "0.0.0.0:8301"}, wantCode: 2, wantStderr: []string{"--addr 0.0.0.0:8301 is beyond loopback"}},
		{name: "view --out and --addr", args: []string{"rl", "view", "runs/x", "--out", "p", "--addr", "127.0.0.1:1"}, wantCode: 2, wantStderr: []string{"--out writes files and --addr"}},
		{name: "profile of no run", args: []string{"rl", "profile", "runs/x"}, wantCode: 1, wantStderr: []string{"legato rl profile:", "runs/x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			code := exitCode(t.Context(), err, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code = %d, want %d (error: %v)", code, tt.wantCode, err)
			}
			if tt.wantStdout != "" {
				golden(t, tt.wantStdout, stdout.String())
			} else if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr.String())
				}
			}
			if len(tt.wantStderr) == 0 && stderr.Len() > 0 {
				t.Errorf("stderr = %q, want nothing", stderr.String())
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	failure := errors.New("legato rl collect: desktop 3 failed")
	tests := []struct {
		name       string
		ctx        context.Context
		err        error
		wantCode   int
		wantStderr string
	}{
		{"ok", context.Background(), nil, 0, ""},
		{"failure", context.Background(), failure, 1, "legato rl collect: desktop 3 failed\n"},
		{"usage", context.Background(), usageErrorf("legato rl: missing subcommand"), 2,
			"legato rl: missing subcommand\nRun 'legato rl help' for usage.\n"},
		{"wrapped usage", context.Background(), fmt.Errorf("legato rl probe: %w", usageErrorf("flag provided but not defined: -x")), 2,
			"legato rl probe: flag provided but not defined: -x\nRun 'legato rl help' for usage.\n"},
		{"help asked for", context.Background(), fmt.Errorf("legato rl probe: %w", flag.ErrHelp), 0, ""},
		{"interrupted", cancelled, fmt.Errorf("legato rl collect: %w", context.Canceled), 130,
			"legato rl collect: context canceled\nlegato: interrupted\n"},
		{"interrupted after a failure", cancelled, failure, 130, "legato rl collect: desktop 3 failed\nlegato: interrupted\n"},
		{"finished despite a signal", cancelled, nil, 0, ""},
		// A cancellation the command made itself is a failure, not Ctrl-C.
		{"canceled without a signal", context.Background(), context.Canceled, 1, "context canceled\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := exitCode(tt.ctx, tt.err, &stderr); code != tt.wantCode {
				t.Errorf("exitCode = %d, want %d", code, tt.wantCode)
			}
			if diff := cmp.Diff(tt.wantStderr, stderr.String()); diff != "" {
				t.Errorf("stderr mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantCode  int
		wantGroup int // checked when parsing succeeds
	}{
		{"ok", []string{"-group", "8"}, 0, 8},
		{"help", []string{"-h"}, 0, 0},
		{"unknown flag", []string{"-grup", "8"}, 2, 0},
		{"bad value", []string{"-group", "many"}, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("legato rl collect", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			group := fs.Int("group", 4, "attempts per task")
			err := parseFlags(fs, tt.args)
			if code := exitCode(t.Context(), err, io.Discard); code != tt.wantCode {
				t.Errorf("exit code = %d, want %d (error: %v)", code, tt.wantCode, err)
			}
			if err == nil && *group != tt.wantGroup {
				t.Errorf("group = %d, want %d", *group, tt.wantGroup)
			}
		})
	}
}

// TestProcess runs the real main in a child process: the exit status
// reaches the shell and the output goes where it should.
func TestProcess(t *testing.T) {
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout bool
	}{
		{[]string{"rl", "help"}, 0, true},
		{[]string{"rl", "frob"}, 2, false},
		{[]string{"rl", "export", "runs/x"}, 2, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], tt.args...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode {
				t.Errorf("exit status = %d, want %d; stderr:\n%s", code, tt.wantCode, stderr.String())
			}
			if got := stdout.Len() > 0; got != tt.wantStdout {
				t.Errorf("wrote to stdout: %v, want %v; stdout:\n%s", got, tt.wantStdout, stdout.String())
			}
			if got := stderr.Len() > 0; got == tt.wantStdout {
				t.Errorf("wrote to stderr: %v, want %v; stderr:\n%s", got, !tt.wantStdout, stderr.String())
			}
		})
	}
}

// TestUsageErrorPrintedOnce: a bad flag value is reported once, with where
// to find the usage, not by the flag set and again by main; -h still
// prints the usage.
func TestUsageErrorPrintedOnce(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"rl", "collect", "--out", "x", "--desktops", "0"}, `invalid value "0" for flag -desktops`},
		{[]string{"rl", "collect", "--out", "x", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"rl", "export", "--bogus", "dir"}, "flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := exitCode(t.Context(), run(t.Context(), tt.args, &stdout, &stderr), &stderr)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			if n := strings.Count(stderr.String(), tt.want); n != 1 {
				t.Errorf("stderr says %q %d times, want once:\n%s", tt.want, n, stderr.String())
			}
			if !strings.Contains(stderr.String(), "Run 'legato rl help'") {
				t.Errorf("stderr does not say where the usage is:\n%s", stderr.String())
			}
		})
	}
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"rl", "collect", "-h"}, &stdout, &stdout); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("collect -h: %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(stdout.String(), "Usage: legato rl collect") {
		t.Errorf("collect -h printed no usage:\n%s", stdout.String())
	}
}
