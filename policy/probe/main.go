package probe

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"legato/rl/policy"
)

// KeyEnv holds the policy server's key; it is never a flag, so that it
// stays out of argv and shell history.
const KeyEnv = "LEGATO_POLICY_KEY"

// Main runs `legato rl probe --policy-url URL --model M`: it probes the
// server, prints the report on stdout, and returns an error wrapping
// ErrNotTrainable when the server cannot give trainable data. args are the
// flags after the subcommand.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: legato rl probe --policy-url URL --model M [--step-timeout D] [--image-max N]\n\n"+
			"Checks that the model server returns what training needs. The key, if any, is read from $%s.\n\n", KeyEnv)
		fs.PrintDefaults()
	}
	var cfg policy.Config
	fs.StringVar(&cfg.BaseURL, "policy-url", "", "the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
	fs.StringVar(&cfg.Model, "model", "", "the model `name` the server serves the policy under")
	fs.DurationVar(&cfg.StepTimeout, "step-timeout", policy.DefaultStepTimeout, "bound on each request")
	var opts Options
	fs.IntVar(&opts.ImageMax, "image-max", DefaultImageMax, "screenshots to send in one prompt: the --image-max collect will use")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("probe: unexpected arguments %q", fs.Args())
	}
	cfg.APIKey = os.Getenv(KeyEnv)
	r, err := Run(ctx, cfg, opts)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if err := r.WriteTable(stdout); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("probe: %w", ctx.Err())
	}
	if !r.Trainable {
		return fmt.Errorf("probe %s: %w", r.BaseURL, ErrNotTrainable)
	}
	return nil
}
