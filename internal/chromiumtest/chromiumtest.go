// Package chromiumtest finds the headless Chromium that the HTML reports'
// tests (export/profile, export/view) draw their pages with.
package chromiumtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Path returns the path of a headless-capable Chromium. The test fails
// without one: .ci/test installs Debian's chromium package.
func Path(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found in PATH: install Debian's chromium package " +
		"(apt-get install --no-install-recommends chromium); .ci/test installs it")
	return ""
}

// Run loads url in headless Chromium bin with extra flags (--dump-dom,
// --screenshot=FILE, ...) and returns its stdout. Its profile and HOME are
// the test's temporary directory; it fetches nothing of its own (no
// background networking, updates, sync or proxy), so the only server it
// reaches is the one url names, the test's on loopback or none.
func Run(t testing.TB, bin, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	home := t.TempDir()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-extensions", "--no-proxy-server", "--hide-scrollbars",
		"--user-data-dir=" + filepath.Join(home, "profile"), "--window-size=1400,900",
	}, extra...)
	args = append(args, url)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = home
	cmd.Env = append(os.Environ(), "HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", bin, strings.Join(extra, " "), err, stderr.String())
	}
	return stdout.Bytes()
}
