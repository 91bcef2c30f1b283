package main

import (
	"context"
	"io"
)

// runExport is `legato rl export`: it writes one training sample per model
// call of a run, with group advantages.
// It is a placeholder until it is built: it parses no flags and fails with
// errNotBuilt.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotBuilt
}
