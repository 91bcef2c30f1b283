package osworld

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestAppsImagePkill runs the real-apps image's pkill (apps-image/files)
// on this machine: `pkill chrome`, as OSWorld's task configs end Chrome,
// also ends a process named chromium, as Debian's Chromium names its
// own; one named chrome still ends, and one named chromix does not. The
// processes are this test's children and the pkill is held to them (-P),
// so nothing else on the machine is touched.
func TestAppsImagePkill(t *testing.T) {
	if _, err := os.Stat("/usr/bin/pkill"); err != nil {
		t.Fatalf("procps' pkill: %v (.ci/test installs procps)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// ended is closed when its process has ended, with err its Wait's.
	type child struct {
		ended chan struct{}
		err   error
	}
	children := map[string]*child{}
	for _, name := range []string{"chromium", "chrome", "chromix"} {
		cmd := exec.Command(sleepNamed(t, name), "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{ended: make(chan struct{})}
		children[name] = c
		go func() { c.err = cmd.Wait(); close(c.ended) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-c.ended })
	}
	out, err := exec.CommandContext(ctx, "sh", filepath.Join("testdata", "apps-image", "files", "pkill"),
		"-P", strconv.Itoa(os.Getpid()), "chrome").CombinedOutput()
	if err != nil {
		t.Fatalf("pkill chrome: %v (%s)", err, out)
	}
	for _, name := range []string{"chromium", "chrome"} {
		c := children[name]
		select {
		case <-c.ended:
			var exit *exec.ExitError
			if !errors.As(c.err, &exit) || exit.String() != "signal: terminated" {
				t.Errorf("%s: %v; want ended by SIGTERM", name, c.err)
			}
		case <-ctx.Done():
			t.Fatalf("%s still runs after pkill chrome", name)
		}
	}
	// Its pkill signalled every match before it returned: chromix is
	// no match if it is still running now.
	select {
	case <-children["chromix"].ended:
		t.Errorf("chromix ended (%v); pkill chrome must not match it", children["chromix"].err)
	default:
	}
}

// sleepNamed is a copy of sleep(1) whose process is named name (a
// process's name, comm, is its program file's), in a directory of the
// test's own.
func sleepNamed(t *testing.T, name string) string {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
