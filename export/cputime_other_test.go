//go:build !unix

package export_test

import "time"

// cpuTime is unknown here; benchmarks report no CPU figures.
func cpuTime() time.Duration { return 0 }

// diskUsage is unknown here; benchmarks report no disk figures.
func diskUsage(string) (apparent, disk int64, err error) { return 0, 0, nil }
