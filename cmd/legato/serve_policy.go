package main

import (
	"context"
	"io"

	"legato/rl/policy/policytest"
)

// runServePolicy is `legato rl serve-policy`: the scripted OpenAI-compatible
// model server on a loopback port, for wiring up a trainer or a test
// without a GPU.
func runServePolicy(ctx context.Context, args []string, stdout, _ io.Writer) error {
	return policytest.ServeMain(ctx, args, stdout)
}
