//go:build unix

package export_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"legato/rl/export"
)

// TestExportHonoursUmask checks that the samples file gets the mode
// os.Create would give it, 0666 less the umask, not a forced 0644. The
// umask belongs to the process: this test is not parallel, and no test of
// this package is.
func TestExportHonoursUmask(t *testing.T) {
	for _, mask := range []int{0o077, 0o022, 0o002} {
		t.Run(fmt.Sprintf("%04o", mask), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "train.jsonl")
			old := syscall.Umask(mask)
			_, err := export.ExportSteps(fixedRun, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
			syscall.Umask(old)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fi.Mode().Perm(), os.FileMode(0o666&^mask); got != want {
				t.Errorf("export has mode %04o under umask %04o, want %04o", got, mask, want)
			}
		})
	}
}
