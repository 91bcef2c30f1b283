//go:build unix

package export_test

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system) the process has used, so a
// benchmark on a shared machine can report work done per CPU second, which
// other processes' load does not change.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
