//go:build unix

package profile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"legato/rl/export/profile"
)

// TestHTMLHonoursUmask checks that the page gets the mode os.Create would
// give it, 0666 less the umask, not a forced 0644. The umask belongs to the
// process: this test is not parallel, and no test of this package is.
func TestHTMLHonoursUmask(t *testing.T) {
	rep := build(t, fixedRun)
	for _, mask := range []int{0o077, 0o022, 0o002} {
		t.Run(fmt.Sprintf("%04o", mask), func(t *testing.T) {
			page := filepath.Join(t.TempDir(), "profile.html")
			old := syscall.Umask(mask)
			err := profile.WriteHTMLFile(page, rep)
			syscall.Umask(old)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(page)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fi.Mode().Perm(), os.FileMode(0o666&^mask); got != want {
				t.Errorf("page has mode %04o under umask %04o, want %04o", got, mask, want)
			}
		})
	}
}
