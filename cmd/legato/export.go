package main

import (
	"context"
	"io"

	"legato/rl/export"
)

// runExport is `legato rl export`: it writes one training sample per model
// call of a run, with group advantages.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return export.Main(ctx, args, stdout, stderr)
}
