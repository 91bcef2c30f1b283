// Package chromiumtest finds the headless Chromium that the HTML reports'
// tests (export/profile, export/view) draw their pages with.
package chromiumtest

import (
	"os/exec"
	"testing"
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
