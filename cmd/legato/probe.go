package main

import (
	"context"
	"io"

	"legato/rl/policy/probe"
)

// runProbe is `legato rl probe`: it checks that a model server can serve
// training data (logprobs, token ids, cached-token reporting, images).
func runProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return probe.Main(ctx, args, stdout, stderr)
}
