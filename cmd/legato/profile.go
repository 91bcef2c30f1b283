package main

import (
	"context"
	"io"
)

// runProfile is `legato rl profile`: it reports where a batch spent its
// time.
// It is a placeholder until it is built: it parses no flags and fails with
// errNotBuilt.
func runProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errNotBuilt
}
