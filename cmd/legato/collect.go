package main

import (
	"context"
	"io"
)

// runCollect is `legato rl collect`: it runs a batch of graded rollouts
// into a run directory.
// It is a placeholder until it is built: it parses no flags and fails with
// errNotBuilt.
func runCollect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotBuilt
}
