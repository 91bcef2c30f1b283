//go:build !unix

package qwen

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
