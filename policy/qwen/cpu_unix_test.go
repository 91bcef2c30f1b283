//go:build unix

package qwen

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, user and system.
// Benchmarks report it beside wall time, which on a shared machine says
// more about the neighbours than about the code.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
