package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
)

// servePolicyCommand is `legato rl serve-policy`: the scripted
// OpenAI-compatible model server on a loopback port, for wiring up a
// trainer or a test without a GPU.
type servePolicyCommand struct {
	opts       policytest.Options
	addr       string
	dialect    string
	version    string
	fault      policytest.Fault
	every      int
	requireKey bool
	sample     bool
	seed       uint64
}

func (c *servePolicyCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl serve-policy", stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8000", "loopback `address` to listen on (port 0: any free port)")
	choiceVar(fs, &c.dialect, "dialect", string(policytest.VLLM), []string{string(policytest.VLLM), string(policytest.SGLang), string(policytest.OpenAI)}, "wire `dialect`")
	fs.StringVar(&c.version, "version", string(policytest.Latest), "the dialect's `release` to answer as: vllm 0.10.1, 0.10.2 or latest; sglang 0.4, 0.5.13 or latest")
	intVar(fs, &c.opts.ImageLimit, "image-limit", 0, 0, math.MaxInt, "refuse prompts with more than n images, like vLLM's --limit-mm-per-prompt (0: no limit)")
	fs.StringVar(&c.opts.Model, "model", "", "served model `name` (default: accept any)")
	fs.BoolVar(&c.opts.NoLatency, "no-latency", false, "answer at once instead of following the H100-shaped latency model")
	fs.BoolVar(&c.opts.NoCacheReport, "no-cache-report", false, "leave cached tokens out of usage (vLLM without --enable-prompt-tokens-details)")
	fs.BoolVar(&c.opts.ToolCalls, "tool-calls", false, "return <tool_call> blocks as OpenAI tool_calls")
	fs.BoolVar(&c.opts.SplitReasoning, "reasoning", false, "return a leading <think> block as the reasoning field")
	intVar(fs, &c.opts.ImageTokens, "image-tokens", policytest.DefaultImageTokens, 1, 1<<20, "prompt tokens per image")
	fs.TextVar(&c.fault, "fault", policytest.NoFault, "`fault` to inject: none, hang, 500, 429, refuse-field, ignore-field, flat-error, 401-string, malformed-json, truncated-body, slow-first-byte, no-logprobs, logprobs-mismatch, validation-400, null-logprobs, 503, html-200, abort")
	intVar(fs, &c.every, "fault-every", 1, 1, math.MaxInt, "inject the fault on every n-th request")
	fs.BoolVar(&c.requireKey, "require-key", false, "require the bearer key from $"+policy.KeyEnv)
	fs.BoolVar(&c.sample, "sample", false, "draw each reply (from --seed and the request's arrival) instead of deriving it from the task: a group's attempts then differ")
	fs.Uint64Var(&c.seed, "seed", 1, "with --sample: the `seed` of the draws")
	setUsage(fs, `Usage: legato rl serve-policy [--addr 127.0.0.1:8000] [flags]

Serves a scripted model over the OpenAI chat-completions API on a loopback
port until interrupted: replies with token ids and logprobs, a prefix cache
that reports cached tokens, a latency model and injectable faults, in the
dialect of vLLM, SGLang or OpenAI. No GPU, no weights.

`)
	return fs
}

// Run parses args and serves until ctx is done.
func (c *servePolicyCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if err := policytest.CheckAddr(c.addr); err != nil {
		return usageErrorf("--addr: %w", err)
	}
	seedSet := false
	fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "seed" })
	if seedSet && !c.sample {
		return usageErrorf("--seed is the seed of --sample's draws: give --sample too")
	}
	if c.sample {
		c.opts.Script = policytest.SampledScript(c.seed)
	}
	c.opts.Dialect = policytest.Dialect(c.dialect)
	c.opts.Version = policytest.Version(c.version)
	if c.fault != policytest.NoFault {
		c.opts.Faults = policytest.FaultEvery(c.every, c.fault)
	}
	if c.requireKey {
		c.opts.APIKey = os.Getenv(policy.KeyEnv)
		if c.opts.APIKey == "" {
			return usageErrorf("--require-key needs the key in $%s", policy.KeyEnv)
		}
	}
	if err := c.opts.Validate(); err != nil {
		return usage(err)
	}
	s, err := policytest.Listen(c.addr, c.opts)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(stdout, "scripted model server (%s %s) on %s\n", c.opts.Dialect, c.opts.Version, s.URL())
	<-ctx.Done()
	return nil
}
