package main

import (
	"context"
	"io"

	"legato/rl/export/profile"
)

// runProfile is `legato rl profile`: where a batch spent its time, as text
// and as a self-contained HTML page.
func runProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return profile.Main(ctx, args, stdout, stderr)
}
