//go:build !unix

package export_test

import "time"

// cpuTime is unknown here; benchmarks report no CPU figures.
func cpuTime() time.Duration { return 0 }
