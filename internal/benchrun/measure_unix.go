//go:build unix

package benchrun

import (
	"io/fs"
	"path/filepath"
	"syscall"
	"time"
)

// CPUTime returns the CPU time (user + system) the process has used, so a
// benchmark on a shared machine can report work done per CPU second, which
// other processes' load does not change.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// DiskUsage returns the apparent size of the files under dir and the
// space they take on disk (their blocks), which small files round up.
func DiskUsage(dir string) (apparent, disk int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		apparent += st.Size
		disk += st.Blocks * 512
		return nil
	})
	return apparent, disk, err
}
