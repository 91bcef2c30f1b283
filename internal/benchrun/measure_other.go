//go:build !unix

package benchrun

import "time"

// CPUTime is 0 where the process's CPU time is not known.
func CPUTime() time.Duration { return 0 }

// DiskUsage is 0, 0 where blocks on disk are not known.
func DiskUsage(string) (apparent, disk int64, err error) { return 0, 0, nil }
