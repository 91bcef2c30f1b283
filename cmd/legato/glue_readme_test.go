package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestREADMEGlue runs the command lines of the README's "Use with slime /
// SkyRL / verl" block as written, on free loopback ports and in a
// temporary run directory instead of 8300, 30000 and runs/glue: the model
// server and the service in the background (each until its first line of
// output), then each glue's try_glue.py, which must exit 0 saying its
// output fits its trainer's descriptor.
func TestREADMEGlue(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is missing; .ci/test installs it")
		}
		t.Skip("no python3")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	lines := readmeBlock(t, filepath.Join(root, "README.md"), "\n## Use with slime / SkyRL / verl\n")
	if len(lines) < 5 {
		t.Fatalf("the README's glue block has %d command lines, want the model server, the service and three glues", len(lines))
	}
	swap := strings.NewReplacer(
		"127.0.0.1:8300", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"127.0.0.1:30000", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"runs/glue", filepath.Join(t.TempDir(), "glue"))
	env := append(os.Environ(), runMainEnv+"=1", "PYTHONDONTWRITEBYTECODE=1")
	ran := 0
	for _, line := range lines {
		background := strings.HasSuffix(line, "&")
		args := strings.Fields(swap.Replace(strings.TrimSuffix(line, "&")))
		switch args[0] {
		case "legato":
			args[0] = os.Args[0]
		case "python3":
			args[0] = py
		default:
			t.Fatalf("README line %q: runs %s, which this test cannot", line, args[0])
		}
		cmd := exec.CommandContext(t.Context(), args[0], args[1:]...)
		cmd.Dir, cmd.Env = root, env
		if background {
			startBackground(t, cmd, line)
			continue
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("README line %q: %v\n%s", line, err, out)
		}
		if !bytes.Contains(out, []byte(": fits descriptors/")) {
			t.Errorf("README line %q: no fit reported:\n%s", line, out)
		}
		t.Logf("%s\n%s", line, out)
		ran++
	}
	if ran != 3 {
		t.Errorf("%d glue lines ran, want slime's, SkyRL's and verl's", ran)
	}
}

// readmeBlock returns the command lines of the first bash block after
// heading in the README at path, comments cut.
func readmeBlock(t *testing.T, path, heading string) []string {
	t.Helper()
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := bytes.Cut(readme, []byte(heading))
	if !ok {
		t.Fatalf("README.md has no %q section", strings.TrimSpace(heading))
	}
	_, block, ok := bytes.Cut(section, []byte("\n```bash\n"))
	if !ok {
		t.Fatalf("the %q section has no bash block", strings.TrimSpace(heading))
	}
	block, _, _ = bytes.Cut(block, []byte("\n```\n"))
	var lines []string
	for _, l := range strings.Split(string(block), "\n") {
		l, _, _ = strings.Cut(l, " #")
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// startBackground starts cmd, waits for its first line of output (a
// server saying where it listens) and stops it (SIGTERM, then waits) when
// the test ends.
func startBackground(t *testing.T, cmd *exec.Cmd, line string) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("README line %q: %v", line, err)
	}
	first := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		for sc.Scan() {
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-drained
		_ = cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	select {
	case l, ok := <-first:
		if !ok {
			<-drained
			_ = cmd.Wait() // stderr is whole once it returns
			t.Fatalf("README line %q: ended with no output: %s", line, stderr.String())
		}
		t.Logf("%s\n%s", line, l)
	case <-ctx.Done():
		t.Fatalf("README line %q: no output in 60 s", line)
	}
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
