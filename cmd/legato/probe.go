package main

import (
	"context"
	"io"
)

// runProbe is `legato rl probe`: it checks that a model server can serve
// training data (logprobs, token ids, cached-token reporting, images).
// It is a placeholder until it is built: it parses no flags and fails with
// errNotBuilt.
func runProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotBuilt
}
