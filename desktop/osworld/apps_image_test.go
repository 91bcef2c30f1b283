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
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	exited := map[string]chan error{}
	for _, name := range []string{"chromium", "chrome", "chromix"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(p, "600") // the process is named after its file
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		exited[name] = done
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
	}
	out, err := exec.CommandContext(ctx, "sh", filepath.Join("testdata", "apps-image", "files", "pkill"),
		"-P", strconv.Itoa(os.Getpid()), "chrome").CombinedOutput()
	if err != nil {
		t.Fatalf("pkill chrome: %v (%s)", err, out)
	}
	for _, name := range []string{"chromium", "chrome"} {
		select {
		case err := <-exited[name]:
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.String() != "signal: terminated" {
				t.Errorf("%s: %v; want ended by SIGTERM", name, err)
			}
			exited[name] <- err // for the cleanup
		case <-ctx.Done():
			t.Fatalf("%s still runs after pkill chrome", name)
		}
	}
	// Its pkill signalled every match before it returned: chromix is
	// no match if it is still running now.
	select {
	case err := <-exited["chromix"]:
		t.Errorf("chromix ended (%v); pkill chrome must not match it", err)
		exited["chromix"] <- err
	default:
	}
}
