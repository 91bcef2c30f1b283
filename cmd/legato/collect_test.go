package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestCollectBuiltinDefault runs the README's main command in-process: the
// fake backend, the built-in scripted server, the built-in demo tasks.
func TestCollectBuiltinDefault(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"rl", "collect", "--out", out, "--fake-speed", "none", "--desktops", "2", "--group", "2"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("collect: %v\nstderr:\n%s", err, stderr.String())
	}
	var n, ok int
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		n++
		if r.Status == schema.StatusOK {
			ok++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// 6 demo tasks × 2 attempts, nothing failing.
	if n != 12 || ok != 12 {
		t.Errorf("records = %d, ok = %d; want 12 and 12", n, ok)
	}
	if !strings.Contains(stdout.String(), "6/6 groups closed") {
		t.Errorf("stdout does not report 6/6 groups closed:\n%s", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(out, schema.SummaryFile)); err != nil {
		t.Errorf("no summary: %v", err)
	}
}

func TestCollectFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no out", []string{}, "--out DIR is required"},
		{"backend", []string{"--out", "x", "--backend", "docker"}, `--backend "docker"`},
		{"speed", []string{"--out", "x", "--fake-speed", "warp"}, `--fake-speed "warp"`},
		{"url without version", []string{"--out", "x", "--policy-url", "http://127.0.0.1:1/v1", "--model", "m"}, "--model and --version are required"},
		{"bad seconds", []string{"--out", "x", "--step-timeout", "soon"}, `invalid value "soon" for flag -step-timeout: want from 1ms to 24h`},
		{"group 0", []string{"--out", "x", "--group", "0"}, `invalid value "0" for flag -group: want an integer from 1 to 1024`},
		{"negative group", []string{"--out", "x", "--group", "-3"}, `invalid value "-3" for flag -group`},
		{"huge group", []string{"--out", "x", "--group", "1000000"}, `invalid value "1000000" for flag -group`},
		{"overflowing group", []string{"--out", "x", "--group", "9223372036854775807", "--oversample", "0.5"}, `invalid value "9223372036854775807" for flag -group`},
		{"desktops 0", []string{"--out", "x", "--desktops", "0"}, `invalid value "0" for flag -desktops: want an integer from 1 to 4096`},
		{"negative image max", []string{"--out", "x", "--image-max", "-1"}, `invalid value "-1" for flag -image-max`},
		{"negative max steps", []string{"--out", "x", "--max-steps", "-1"}, `invalid value "-1" for flag -max-steps`},
		{"step timeout 0", []string{"--out", "x", "--step-timeout", "0"}, `invalid value "0" for flag -step-timeout`},
		{"server-down timeout 0", []string{"--out", "x", "--server-down-timeout", "0"}, `invalid value "0" for flag -server-down-timeout`},
		{"NaN oversample", []string{"--out", "x", "--oversample", "NaN"}, "Oversample (--oversample) NaN"},
		{"fixed wait without the flag", []string{"--out", "x", "--fixed-wait", "1"}, "--fixed-wait applies only with --no-ready-signal"},
		{"NaN step timeout", []string{"--out", "x", "--step-timeout", "NaN"}, `invalid value "NaN" for flag -step-timeout`},
		{"huge rollout timeout", []string{"--out", "x", "--rollout-timeout", "1e300"}, `invalid value "1e300" for flag -rollout-timeout`},
		{"infinite server-down timeout", []string{"--out", "x", "--server-down-timeout", "Inf"}, `invalid value "Inf" for flag -server-down-timeout`},
		{"temperature", []string{"--out", "x", "--temperature", "3"}, "--temperature 3: want 0 to 2"},
		{"fake success above 1", []string{"--out", "x", "--fake-success", "3"}, "--fake-success 3: want a probability from 0 to 1"},
		{"negative fake success", []string{"--out", "x", "--fake-success", "-0.5"}, "--fake-success -0.5"},
		{"NaN fake success", []string{"--out", "x", "--fake-success", "NaN"}, "--fake-success NaN"},
		{"100ns rollout timeout", []string{"--out", "x", "--rollout-timeout", "100ns"}, "--rollout-timeout) 100ns: want 0 (no cap) or at least 1s"},
		{"negative env retries", []string{"--out", "x", "--env-retries", "-1"}, `invalid value "-1" for flag -env-retries`},
		{"negative retries", []string{"--out", "x", "--retries", "-1"}, `invalid value "-1" for flag -retries`},
		{"negative max inflight", []string{"--out", "x", "--max-inflight", "-1"}, `invalid value "-1" for flag -max-inflight`},
		{"negative max tokens", []string{"--out", "x", "--max-tokens", "-1"}, `invalid value "-1" for flag -max-tokens`},
		{"negative oversample", []string{"--out", "x", "--oversample", "-1"}, "Oversample (--oversample) -1"},
		{"negative fixed wait", []string{"--out", "x", "--no-ready-signal", "--fixed-wait", "-1"}, `invalid value "-1" for flag -fixed-wait`},
		{"history", []string{"--out", "x", "--history", "full"}, `invalid value "full" for flag -history`},
		{"advantage std", []string{"--out", "x", "--advantage-std", "unbiased"}, `invalid value "unbiased" for flag -advantage-std: want population or sample`},
		{"grade twice above 1", []string{"--out", "x", "--grade-twice=2"}, `-grade-twice: "2": want a fraction from 0 to 1`},
		{"grade twice not a number", []string{"--out", "x", "--grade-twice=most"}, `-grade-twice: "most": want a fraction`},
		{"flaky task not in the batch", []string{"--out", "x", "--fake-flaky", "no-such-task"}, `--fake-flaky "no-such-task": no such task in the batch`},
		{"solved task not in the batch", []string{"--out", "x", "--fake-solved-at-start", "no-such-task"}, `--fake-solved-at-start "no-such-task": no such task in the batch`},
		{"quarantine setup fails 0", []string{"--out", "x", "--quarantine-setup-fails", "0"}, `invalid value "0" for flag -quarantine-setup-fails`},
		{"contiguous with image max", []string{"--out", "x", "--history", "contiguous", "--image-max", "5"}, "--image-max does not go with --history contiguous"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := runCollect(t.Context(), tt.args, &bytes.Buffer{}, &stderr)
			if err == nil {
				t.Fatal("no error")
			}
			var u *usageError
			if !errors.As(err, &u) {
				t.Errorf("error %v is not a usage error", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// TestCollectAdvantageStd: collect --advantage-std sample records it in
// batch.json, export then follows it without a warning, and continuing the
// batch with the population std exits 2 naming the flag, while continuing
// it without the flag keeps the batch's.
func TestCollectAdvantageStd(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"rl", "collect", "--out", out, "--fake-speed", "none", "--desktops", "2", "--group", "4", "--max-steps", "2"}
	var stderr bytes.Buffer
	if err := run(t.Context(), append(args, "--advantage-std", "sample"), io.Discard, &stderr); err != nil {
		t.Fatalf("collect: %v\nstderr:\n%s", err, stderr.String())
	}
	if b, err := schema.ReadBatch(out); err != nil || b.AdvantageStd != schema.SampleStd {
		t.Fatalf("batch.json: %+v, %v; want advantage_std sample", b, err)
	}
	stderr.Reset()
	if err := run(t.Context(), []string{"rl", "export", out, "--out", filepath.Join(t.TempDir(), "train.jsonl"), "--allow-missing-logprobs"}, io.Discard, &stderr); err != nil {
		t.Fatalf("export: %v\nstderr:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "advantage-std") {
		t.Errorf("export of the batch's own std warns:\n%s", stderr.String())
	}
	stderr.Reset()
	err := run(t.Context(), append(args, "--advantage-std", "population"), io.Discard, &stderr)
	if code := exitCode(t.Context(), err, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--advantage-std sample, not population") {
		t.Errorf("continuing with --advantage-std population: exit %d, stderr:\n%s\nwant %d naming the flag", code, stderr.String(), exitUsage)
	}
	stderr.Reset()
	if err := run(t.Context(), args, io.Discard, &stderr); err != nil {
		t.Fatalf("continuing without --advantage-std: %v\nstderr:\n%s", err, stderr.String())
	}
	if b, err := schema.ReadBatch(out); err != nil || b.AdvantageStd != schema.SampleStd {
		t.Errorf("batch.json after continuing: %+v, %v; want advantage_std sample kept", b, err)
	}
}

// TestBackendFlagRefused: a flag of one backend given with the other exits
// 2 naming the flag and the backend, in every command that takes backend
// flags, before any desktop or model server starts (the osworld rows name
// a guest nothing listens on).
func TestBackendFlagRefused(t *testing.T) {
	dir := t.TempDir()
	guest := []string{"--backend", "osworld", "--guest-url", "http://127.0.0.1:1", "--tasks", filepath.Join(dir, "tasks.json")}
	osworldWith := func(extra ...string) []string { return append(slices.Clone(guest), extra...) }
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"golden fork with fake", []string{"rl", "collect", "--out", dir, "--backend", "fake", "--golden-fork"},
			[]string{"--golden-fork is a flag of the osworld backend and --backend is fake: drop it, or use --backend osworld"}},
		{"fork dir with the default backend", []string{"rl", "collect", "--out", dir, "--fork-dir", dir},
			[]string{"--fork-dir is a flag of the osworld backend and --backend is fake"}},
		{"guest url and grader with fake", []string{"rl", "collect", "--out", dir, "--guest-url", "http://127.0.0.1:1", "--grader", "native"},
			[]string{"--grader is a flag of the osworld backend", "--guest-url is a flag of the osworld backend"}},
		{"fake seed with osworld", append([]string{"rl", "collect", "--out", dir}, osworldWith("--fake-seed", "3")...),
			[]string{"--fake-seed is a flag of the fake backend and --backend is osworld: drop it, or use --backend fake"}},
		{"fake speed with osworld and a model server", append([]string{"rl", "collect", "--out", dir, "--policy-url", "http://127.0.0.1:1/v1", "--model", "m", "--version", "v"}, osworldWith("--fake-speed", "none")...),
			[]string{"--fake-speed is a flag of the fake backend (and of the built-in model server, which does not run with --policy-url or without a model) and --backend is osworld"}},
		{"serve", []string{"rl", "serve", "--out", dir, "--golden-max", "2"},
			[]string{"--golden-max is a flag of the osworld backend and --backend is fake"}},
		{"replay", []string{"rl", "replay", dir, "--no-golden"},
			[]string{"--no-golden is a flag of the osworld backend and --backend is fake"}},
		{"regrade", append([]string{"rl", "regrade", dir}, osworldWith("--fake-success", "0")...),
			[]string{"--fake-success is a flag of the fake backend and --backend is osworld"}},
		{"tasks check", []string{"rl", "tasks", "check", "--image", dir},
			[]string{"--image is a flag of the osworld backend and --backend is fake"}},
		{"fake speed with osworld in a replay", append([]string{"rl", "replay", dir}, osworldWith("--fake-speed", "none")...),
			[]string{"--fake-speed is a flag of the fake backend (and of the built-in model server"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(t.Context(), tt.args, &bytes.Buffer{}, &stderr)
			if code := exitCode(t.Context(), err, &stderr); code != exitUsage {
				t.Fatalf("exit code %d (%v), want %d", code, err, exitUsage)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestCheckBackendFlags: which flags go with which backend.
func TestCheckBackendFlags(t *testing.T) {
	tests := []struct {
		name          string
		backend       string
		given         []string
		builtinServer bool
		want          string // "" for accepted
	}{
		{"fake flags with fake", "fake", []string{"fake-seed", "fake-success", "fake-flaky", "fake-solved-at-start", "fake-speed"}, true, ""},
		{"osworld flags with osworld", "osworld", []string{"golden-fork", "fork-dir", "guest-url", "image", "grade-workers", "host"}, true, ""},
		{"common flags with both", "fake", []string{"tasks", "desktops", "group", "keep-end-states", "quarantine"}, true, ""},
		{"osworld checkout with fake: resolves the tasks", "fake", []string{"osworld"}, true, ""},
		{"fake speed with osworld and the built-in server", "osworld", []string{"fake-speed"}, true, ""},
		{"unknown backend left to setup", "docker", []string{"golden-fork", "fake-seed"}, true, ""},
		{"golden fork with fake", "fake", []string{"golden-fork"}, true, "--golden-fork is a flag of the osworld backend and --backend is fake"},
		{"fake speed with osworld and no built-in server", "osworld", []string{"fake-speed"}, false, "--fake-speed is a flag of the fake backend"},
		{"fake flaky with osworld", "osworld", []string{"fake-flaky"}, true, "--fake-flaky is a flag of the fake backend and --backend is osworld"},
		{"fake solved at start with osworld", "osworld", []string{"fake-solved-at-start"}, true, "--fake-solved-at-start is a flag of the fake backend and --backend is osworld"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkBackendFlags(tt.backend, tt.given, tt.builtinServer)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one that says %q", err, tt.want)
			}
		})
	}
}

// TestCollectInterrupt sends SIGINT to a real collect process mid-batch: it
// exits 130, distinct from failure, after writing the summary; and a rerun
// into the same directory completes the batch.
func TestCollectInterrupt(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"rl", "collect", "--out", out, "--fake-speed", "demo", "--desktops", "2", "--group", "2"}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupt once the batch has begun: the first line says so.
	sc := bufio.NewScanner(stderr)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.HasPrefix(sc.Text(), "collecting ") {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		seen = append(seen, sc.Text())
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
		t.Fatalf("exit = %v, want status %d; stderr:\n%s", err, exitInterrupted, strings.Join(seen, "\n"))
	}
	if _, err := os.Stat(filepath.Join(out, schema.SummaryFile)); err != nil {
		t.Errorf("no summary after the interrupt: %v", err)
	}

	var stdout, errb bytes.Buffer
	rerun := append([]string(nil), args...)
	rerun[len(rerun)-5] = "none" // --fake-speed none: same batch, faster
	if err := run(t.Context(), rerun, &stdout, &errb); err != nil {
		t.Fatalf("rerun: %v\n%s", err, errb.String())
	}
	if !strings.Contains(stdout.String(), "6/6 groups closed") {
		t.Errorf("rerun did not complete the batch:\n%s", stdout.String())
	}
}

// TestGCNeedsNoImage: gc removes leftovers by name prefix, so it must not
// ask for a base image or guests the way collect does; with an unusable
// libvirt URI it fails on that URI.
func TestGCNeedsNoImage(t *testing.T) {
	err := new(gcCommand).Run(t.Context(), []string{"--host", "qemu:///nowhere"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("gc against qemu:///nowhere succeeded")
	}
	if !strings.Contains(err.Error(), "qemu:///nowhere") || strings.Contains(err.Error(), "--image") {
		t.Errorf("gc error = %q, want one about the libvirt URI and none about an image", err)
	}
}

// TestCollectServerRestart stops the model server in the middle of a real
// batch (loopback HTTP, the fake backend) and starts it again on the same
// port a few seconds later, as a trainer does between policy versions: the
// batch completes with no error record and reports the time it waited.
func TestCollectServerRestart(t *testing.T) {
	srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(srv.URL(), "http://"), "/v1")
	restarted := make(chan *policytest.Server, 1)
	go func() {
		defer close(restarted)
		for srv.Stats().Requests < 4 {
			time.Sleep(10 * time.Millisecond)
		}
		srv.Close()
		time.Sleep(3 * time.Second)
		s, err := policytest.Listen(addr, policytest.Options{Model: "m", NoLatency: true})
		if err != nil {
			t.Errorf("restart the server on %s: %v", addr, err)
			return
		}
		restarted <- s
	}()
	defer func() {
		if s := <-restarted; s != nil {
			s.Close()
		}
	}()

	out := filepath.Join(t.TempDir(), "run")
	var stdout, stderr bytes.Buffer
	// No fake latencies: the server goes at its 4th request, long before
	// the batch's last, and the desktops then wait for it (server_down_s).
	err = run(t.Context(), []string{"rl", "collect", "--out", out, "--policy-url", srv.URL(), "--model", "m", "--version", "v",
		"--fake-speed", "none", "--desktops", "2", "--group", "2", "--step-timeout", "2"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("collect: %v\nstderr:\n%s", err, stderr.String())
	}
	var errs int
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		if r.Status != schema.StatusOK {
			errs++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sum, err := schema.ReadSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	if errs != 0 || sum.State != schema.StateComplete || sum.ServerDownS < 1 {
		t.Errorf("%d records not ok, state %q, server down %v s; want 0, complete, about 3 s\nstdout:\n%s\nstderr:\n%s",
			errs, sum.State, sum.ServerDownS, stdout.String(), stderr.String())
	}
}

// TestCollectSamplingAndHarnessFlags: the sampling knobs reach the server
// and the records, the harness and system prompt reach batch.json, and a
// resume with another system prompt is refused.
func TestCollectSamplingAndHarnessFlags(t *testing.T) {
	srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true, KeepRequests: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	prompt := filepath.Join(dir, "prompt.txt")
	if err := os.WriteFile(prompt, []byte(`You use a computer. Call computer_use in <tool_call> tags.`), 0o666); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "run")
	// Two steps an attempt show the knobs on every request (the demo tasks
	// take up to five, each a second of the race detector's time here), and
	// no wait for the fake's screen, which has settled at once, to look the
	// same twice (300 ms an action).
	args := []string{"rl", "collect", "--out", out, "--policy-url", srv.URL(), "--model", "m", "--version", "v",
		"--fake-speed", "none", "--no-ready-signal", "--max-steps", "2", "--desktops", "2", "--group", "1", "--temperature", "0", "--top-p", "0.9", "--max-tokens", "300",
		"--harness", "qwen25vl", "--system-prompt", prompt}
	var stderr bytes.Buffer
	if err := run(t.Context(), args, &bytes.Buffer{}, &stderr); err != nil {
		t.Fatalf("collect: %v\n%s", err, stderr.String())
	}
	reqs := srv.Requests()
	if len(reqs) == 0 {
		t.Fatal("no request")
	}
	for _, r := range reqs {
		if r.Temperature == nil || *r.Temperature != 0 || r.TopP == nil || *r.TopP != 0.9 || r.MaxTokens != 300 {
			t.Fatalf("request sampling: temperature %v, top-p %v, max tokens %d; want 0, 0.9, 300", r.Temperature, r.TopP, r.MaxTokens)
		}
		if sys := r.Messages[0]; sys.Role != "system" || len(sys.Content) == 0 || !strings.HasPrefix(sys.Content[0].Text, "You use a computer.") {
			t.Fatalf("request's first message %+v is not the file's system prompt", sys)
		}
	}
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		if p := r.Policy; p.Temperature == nil || *p.Temperature != 0 || p.TopP == nil || *p.TopP != 0.9 || p.MaxTokens != 300 {
			t.Errorf("record %s policy block %+v lacks the sampling knobs", r.RolloutID, p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(out, schema.BatchFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"temperature": 0`, `"top_p": 0.9`, "qwen qwen25vl", "system prompt sha256:"} {
		if !strings.Contains(string(manifest), want) {
			t.Errorf("batch.json does not hold %q:\n%s", want, manifest)
		}
	}
	if err := os.WriteFile(prompt, []byte("Another prompt."), 0o666); err != nil {
		t.Fatal(err)
	}
	err = run(t.Context(), args, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "holds another batch: harness") {
		t.Errorf("resume with another system prompt: %v; want a refusal naming the harness", err)
	}
	if code := exitCode(t.Context(), err, io.Discard); code != 2 {
		t.Errorf("resume with another system prompt exits %d, want 2 (usage)", code)
	}
	if err := os.WriteFile(prompt, []byte(`You use a computer. Call computer_use in <tool_call> tags.`), 0o666); err != nil {
		t.Fatal(err)
	}
	err = run(t.Context(), append(slices.Clone(args), "--max-steps", "1"), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--max-steps 2, not 1") {
		t.Errorf("resume with another --max-steps: %v; want a refusal naming it", err)
	}
}

// startCollect starts a real collect process into out and returns once the
// batch has begun (its first line says so), with a scanner of the rest of
// its stderr.
func startCollect(t *testing.T, out string, extra ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	args := append([]string{"rl", "collect", "--out", out}, extra...)
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "collecting ") {
			return cmd, sc
		}
	}
	_ = cmd.Wait()
	t.Fatal("collect ended before the batch began")
	return nil, nil
}

// waitInterrupted reads the rest of stderr and checks that the process
// exited with exitInterrupted.
func waitInterrupted(t *testing.T, cmd *exec.Cmd, sc *bufio.Scanner) string {
	t.Helper()
	var rest []string
	for sc.Scan() {
		rest = append(rest, sc.Text())
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
		t.Fatalf("exit = %v, want status %d; stderr:\n%s", err, exitInterrupted, strings.Join(rest, "\n"))
	}
	return strings.Join(rest, "\n")
}

// TestCollectInterruptManyDesktops: SIGINT to a batch on hundreds of fake
// desktops stops it; the final summary accounts for every line of
// rollouts.jsonl, so nothing was appended after it was written.
func TestCollectInterruptManyDesktops(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cmd, sc := startCollect(t, out, "--desktops", "300", "--group", "100", "--fake-speed", "demo")
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	stderr := waitInterrupted(t, cmd, sc)
	if !strings.Contains(stderr, "interrupt again to exit at once") {
		t.Errorf("stderr does not say how to exit at once:\n%s", stderr)
	}
	data, err := os.ReadFile(filepath.Join(out, schema.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	var sum schema.Summary
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatal(err)
	}
	lines := 0
	if recs, err := os.ReadFile(filepath.Join(out, "rollouts.jsonl")); err == nil {
		lines = bytes.Count(recs, []byte("\n"))
	}
	if !sum.Final || sum.State != schema.StateInterrupted || sum.Records != lines {
		t.Errorf("summary: final %v, state %q, %d records; rollouts.jsonl has %d lines; want final, interrupted, the same count",
			sum.Final, sum.State, sum.Records, lines)
	}
}

// TestCollectSecondInterrupt: a second SIGINT exits at once, and the run
// directory it leaves resumes to a complete batch.
func TestCollectSecondInterrupt(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	// Groups of 4: the interrupts come while the batch starts, so a bigger
	// batch adds nothing but the resume's work.
	cmd, sc := startCollect(t, out, "--desktops", "300", "--group", "4", "--fake-speed", "demo")
	for range 2 {
		// The second may find the process gone already: that is fine.
		_ = cmd.Process.Signal(syscall.SIGINT)
	}
	waitInterrupted(t, cmd, sc)

	var stdout, errb bytes.Buffer
	args := []string{"rl", "collect", "--out", out, "--desktops", "300", "--group", "4", "--fake-speed", "none"}
	if err := run(t.Context(), args, &stdout, &errb); err != nil {
		t.Fatalf("resume: %v\n%s", err, errb.String())
	}
	if !strings.Contains(stdout.String(), "6/6 groups closed") {
		t.Errorf("the resume did not complete the batch:\n%s", stdout.String())
	}
}

// TestSecondSignalExitsAtOnce: the first signal cancels the command's ctx;
// a second one exits with exitInterrupted while the shutdown the first
// began is still held up (here: nothing calls stop).
func TestSecondSignalExitsAtOnce(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	exited := make(chan int, 1)
	stderr := &lockedWriter{w: &bytes.Buffer{}}
	ctx, stop := stopOnSignal(t.Context(), sigs, stderr, func(code int) { exited <- code })
	defer stop()
	sigs <- os.Interrupt
	<-ctx.Done()
	select {
	case code := <-exited:
		t.Fatalf("the first signal exited with %d", code)
	default:
	}
	sigs <- syscall.SIGTERM
	if code := <-exited; code != exitInterrupted {
		t.Errorf("exit code %d, want %d", code, exitInterrupted)
	}
}
