//go:build unix

package schema

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// outputChildEnv names the output TestOutputWriterChild writes; it is set
// only in the child process of TestKilledOutputWriterTempSwept.
const outputChildEnv = "LEGATO_SCHEMA_OUTPUT_CHILD"

// TestOutputWriterChild is the child process of
// TestKilledOutputWriterTempSwept: it starts writing its output, says so,
// and waits inside the write until its stdin closes or it is killed.
func TestOutputWriterChild(t *testing.T) {
	path := os.Getenv(outputChildEnv)
	if path == "" {
		t.Skip("helper process of TestKilledOutputWriterTempSwept")
	}
	_, err := WriteFileAtomic(path, func(w io.Writer) error {
		fmt.Println("writing")
		_, err := io.Copy(io.Discard, os.Stdin) // the parent's end closes at its exit
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

// tempsOf lists the hidden temp files of the output path.
func tempsOf(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(filepath.Dir(path), outputTempPrefix(path)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKilledOutputWriterTempSwept: a writer killed mid-write (export, profile)
// leaves its hidden temp file; the next write of the same output removes it,
// but never a live writer's, nor the temp files of another output.
func TestKilledOutputWriterTempSwept(t *testing.T) {
	if os.Getenv(outputChildEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "train.jsonl")
	other := filepath.Join(dir, ".other.jsonl.tmp-1")
	if err := os.WriteFile(other, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutputWriterChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), outputChildEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "writing") {
	}
	write := func(s string) {
		t.Helper()
		if _, err := WriteFileAtomic(path, func(w io.Writer) error { _, err := io.WriteString(w, s); return err }); err != nil {
			t.Fatal(err)
		}
	}

	write("while the child writes\n")
	if temps := tempsOf(t, path); len(temps) != 1 {
		t.Fatalf("temp files while the child writes: %q, want the child's", temps)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed", err)
	}
	if temps := tempsOf(t, path); len(temps) != 1 {
		t.Fatalf("temp files after the kill: %q, want the child's left", temps)
	}

	write("after the kill\n")
	if temps := tempsOf(t, path); len(temps) != 0 {
		t.Errorf("temp files after the next write: %q, want none", temps)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "after the kill\n" {
		t.Errorf("output = %q, %v", got, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another output's temp file was removed: %v", err)
	}
}
