package policytest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// KeyEnv is the environment variable that holds the policy server's key,
// for the client and, with -require-key, for the scripted server.
const KeyEnv = "LEGATO_POLICY_KEY"

// ServeMain runs `legato rl serve-policy`: the scripted model server on a
// loopback port until ctx is done. args are the flags after the subcommand.
func ServeMain(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve-policy", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var opts Options
	addr := fs.String("addr", "127.0.0.1:8000", "loopback `address` to listen on")
	dialect := fs.String("dialect", string(VLLM), "wire `dialect`: vllm, sglang or openai")
	version := fs.String("version", string(Latest), "the dialect's release to answer as: vllm 0.10.1, 0.10.2 or latest; sglang 0.4, 0.5.13 or latest")
	fs.IntVar(&opts.ImageLimit, "image-limit", 0, "refuse prompts with more than `n` images, like vLLM's --limit-mm-per-prompt (0: no limit)")
	fs.StringVar(&opts.Model, "model", "", "served model `name` (default: accept any)")
	fs.BoolVar(&opts.NoLatency, "no-latency", false, "answer at once instead of following the H100-shaped latency model")
	fs.BoolVar(&opts.NoCacheReport, "no-cache-report", false, "leave cached tokens out of usage (vLLM without --enable-prompt-tokens-details)")
	fs.BoolVar(&opts.ToolCalls, "tool-calls", false, "return <tool_call> blocks as OpenAI tool_calls")
	fs.BoolVar(&opts.SplitReasoning, "reasoning", false, "return a leading <think> block as the reasoning field")
	fs.IntVar(&opts.ImageTokens, "image-tokens", DefaultImageTokens, "prompt tokens per image")
	faultName := fs.String("fault", "none", "`fault` to inject: hang, 500, 429, refuse-field, ignore-field, flat-error, 401-string, malformed-json, truncated-body, slow-first-byte, no-logprobs, logprobs-mismatch, validation-400")
	every := fs.Int("fault-every", 1, "inject the fault on every `n`-th request")
	requireKey := fs.Bool("require-key", false, "require the bearer key from $"+KeyEnv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve-policy: unexpected arguments %q", fs.Args())
	}
	opts.Dialect = Dialect(*dialect)
	opts.Version = Version(*version)
	fault, err := ParseFault(*faultName)
	if err != nil {
		return fmt.Errorf("serve-policy: -fault: %w", err)
	}
	if fault != NoFault {
		if *every < 1 {
			return errors.New("serve-policy: -fault-every must be at least 1")
		}
		opts.Faults = FaultEvery(*every, fault)
	}
	if *requireKey {
		opts.APIKey = os.Getenv(KeyEnv)
		if opts.APIKey == "" {
			return fmt.Errorf("serve-policy: -require-key needs the key in $%s", KeyEnv)
		}
	}
	s, err := Listen(*addr, opts)
	if err != nil {
		return fmt.Errorf("serve-policy: %w", err)
	}
	defer s.Close()
	fmt.Fprintf(stdout, "scripted model server (%s %s) on %s\n", s.opts.Dialect, s.opts.Version, s.URL())
	<-ctx.Done()
	return nil
}
