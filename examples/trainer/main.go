// Command trainer shows a Go trainer that embeds legato: it collects a batch
// on policy version N, consumes each group as soon as it closes (GRPO
// advantages times per-token logprobs, ready for a loss), then moves on to
// version N+1.
//
// It runs on this machine as it is: fake desktops and legato's scripted
// model server stand in for VMs and a GPU. A real trainer keeps the same
// loop, points PolicyConfig at its vLLM or SGLang server, loads the new
// weights there between versions, and uses desktop/osworld desktops.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"

	rl "legato/rl"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
)

func main() {
	versions := flag.Int("versions", 2, "policy versions to train")
	out := flag.String("out", filepath.Join(os.TempDir(), "legato-trainer"), "directory for the runs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := train(ctx, *out, *versions, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// train runs versions batches and returns after the last; it writes one
// line per consumed group to w.
func train(ctx context.Context, dir string, versions int, w io.Writer) error {
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	tasks, err := rl.LoadTasks(filepath.Join(exampleDir(), "fake-tasks.json"), rl.LoadOptions{})
	if err != nil {
		return err
	}
	for v := range versions {
		version := fmt.Sprintf("step-%d", v)
		pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: version}
		opts := rl.CollectOptions{
			Out:        filepath.Join(dir, version),
			NewDesktop: fake.NewFleet(fake.Config{Seed: uint64(v), DefaultReward: fake.Reward{P: 0.5}}).New,
			Desktops:   4,
			Group:      4,
			Oversample: 0.25,
			// OnGroup runs while later groups are still collecting: this
			// is where a trainer would accumulate its policy-gradient loss.
			OnGroup: func(g rl.Group) {
				var loss float64
				tokens := 0
				for i, rec := range g.Finished {
					for _, step := range rec.Steps {
						for _, lp := range step.Response.Logprobs {
							loss -= g.Advantages[i] * lp
							tokens++
						}
					}
				}
				fmt.Fprintf(w, "%s %s: %d rollouts, %d tokens, surrogate loss %.3f\n", version, g.TaskID, len(g.Finished), tokens, loss)
			},
		}
		sum, err := rl.Collect(ctx, tasks, pol, opts)
		if err != nil {
			return fmt.Errorf("version %s: %w", version, err)
		}
		fmt.Fprintf(w, "%s done: success rate %.2f; now load the new weights and continue\n", version, sum.SuccessRate)
	}
	return nil
}

// exampleDir finds examples/ whether the program runs from the repository
// root or from examples/trainer (go test).
func exampleDir() string {
	for _, d := range []string{"examples", ".."} {
		if _, err := os.Stat(filepath.Join(d, "fake-tasks.json")); err == nil {
			return d
		}
	}
	return "examples"
}
