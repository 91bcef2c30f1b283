package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	rl "legato/rl"
	"legato/rl/policy"
	"legato/rl/policy/probe"
)

// probeCommand is `legato rl probe`: it checks that a model server can
// serve training data (logprobs, token ids, cached-token reporting,
// images).
type probeCommand struct {
	cfg  policy.Config
	opts probe.Options
}

func (c *probeCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl probe", stderr)
	fs.StringVar(&c.cfg.BaseURL, "policy-url", "", "the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1 (required)")
	fs.StringVar(&c.cfg.Model, "model", "", "the model `name` the server serves the policy under (required)")
	durationVar(fs, &c.cfg.StepTimeout, "step-timeout", policy.DefaultStepTimeout, time.Second, 24*time.Hour, "bound on each request")
	intVar(fs, &c.opts.ImageMax, "image-max", probe.DefaultImageMax, 1, rl.MaxImageMax, "screenshots to send in one prompt: the --image-max collect will use")
	setUsage(fs, fmt.Sprintf(`Usage: legato rl probe --policy-url URL --model M [--step-timeout D] [--image-max N]

Sends the model server a text request, an image request, a request with
--image-max screenshots and the text request again, and reports whether it
returns what training needs: logprobs, exact token ids, cached-token
reporting, image input. Exits 1 when it cannot serve trainable data. The
key, if any, is read from $%s.

`, policy.KeyEnv))
	return fs
}

// Run parses args and probes the server.
func (c *probeCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	switch {
	case c.cfg.BaseURL == "":
		return usageErrorf("--policy-url URL is required: the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
	case c.cfg.Model == "":
		return usageErrorf("--model NAME is required: the name the server serves the policy under")
	}
	c.cfg.APIKey = os.Getenv(policy.KeyEnv)
	if err := errors.Join(c.cfg.Validate(), c.opts.Validate()); err != nil {
		return usage(err)
	}
	r, err := probe.Run(ctx, c.cfg, c.opts)
	if err != nil {
		return err
	}
	if err := r.WriteTable(stdout); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !r.Trainable {
		return fmt.Errorf("%s: %w", r.BaseURL, probe.ErrNotTrainable)
	}
	return nil
}
