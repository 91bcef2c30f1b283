package export_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// equalityTasks are six tasks the scripted server answers with one to four
// steps each.
func equalityTasks() []rl.Task {
	var ts []rl.Task
	for i := range 6 {
		ts = append(ts, rl.Task{
			ID:          fmt.Sprintf("t%d", i),
			Domain:      "os",
			Instruction: fmt.Sprintf("do thing number %d", i),
			Evaluator:   json.RawMessage(`{"func":"exact_match"}`),
		})
	}
	return ts
}

// equalityDesk draws rewards, latencies of a VM and desktop failures (a
// reset fails one time in five: the attempt is retried on a new desktop).
func equalityDesk() fake.Config {
	return fake.Config{
		Width: 320, Height: 192, Seed: 7,
		ReadyWaiter:   true,
		DefaultReward: fake.Reward{P: 0.5},
		Latency: fake.Latencies{
			Reset:    fake.Latency{Median: 2 * time.Second, Sigma: 0.5},
			Observe:  fake.Latency{Fixed: 100 * time.Millisecond},
			Act:      fake.Latency{Median: 300 * time.Millisecond, Sigma: 0.3},
			Settle:   fake.Latency{Max: time.Second},
			Evaluate: fake.Latency{Median: time.Second, Sigma: 0.5},
		},
		Faults: []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, Prob: 0.2}},
	}
}

// collectRun runs (or continues) the batch in dir on n desktops, stopping
// it after stopAfter when that is not zero, and returns Collect's error.
// It runs in a synctest bubble: latencies take no real time.
func collectRun(t *testing.T, dir string, desktops int, stopAfter time.Duration) error {
	t.Helper()
	srv := policytest.NewPipeServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1",
		StepTimeout: 30 * time.Second, Retries: 1, HTTPClient: srv.Client()}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if stopAfter > 0 {
		stop := time.AfterFunc(stopAfter, cancel)
		defer stop.Stop()
	}
	_, err := rl.Collect(ctx, equalityTasks(), pol, rl.CollectOptions{
		Out: dir, NewDesktop: fake.Factory(equalityDesk()), Desktops: desktops,
		Group: 4, EnvRetries: 3,
		Ready: desktop.ReadyOptions{Interval: 100 * time.Millisecond, Max: 5 * time.Second},
	})
	return err
}

// exported exports dir and returns its samples without their rollout ids,
// in a canonical order.
func exported(t *testing.T, dir string) []export.Sample {
	t.Helper()
	out := filepath.Join(t.TempDir(), "train.jsonl")
	if _, err := export.ExportSteps(dir, out, export.Options{}); err != nil {
		t.Fatal(err)
	}
	samples := readSamples(t, out)
	for i := range samples {
		samples[i].RolloutID = ""
	}
	slices.SortFunc(samples, func(a, b export.Sample) int {
		return cmp.Or(cmp.Compare(a.GroupID, b.GroupID), cmp.Compare(a.Attempt, b.Attempt), cmp.Compare(a.Step, b.Step))
	})
	return samples
}

// TestExportEqualityAcrossDesktopsAndResume is the reproducibility promise
// of --fake-seed: the same batch collected on 1 desktop, on 8, and stopped
// in the middle then resumed exports the same samples (prompts, responses,
// rewards, advantages), rollout ids aside. It needs the scheduler to put
// each attempt's identity in the ctx of its calls (desktop.WithAttempt),
// which the fake keys its draws on.
func TestExportEqualityAcrossDesktopsAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := t.TempDir()
		one := filepath.Join(base, "one")
		if err := collectRun(t, one, 1, 0); err != nil {
			t.Fatalf("1 desktop: %v", err)
		}
		want := exported(t, one)
		// The batch must exercise what it claims to: all groups closed,
		// rewards that differ, and desktop failures retried.
		sum, _, err := export.Summarize(one)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(equalityTasks()) * 4; len(want) == 0 || sum.Counts[schema.StatusOK] != n {
			t.Fatalf("1 desktop: %d ok attempts, want %d (counts %v)", sum.Counts[schema.StatusOK], n, sum.Counts)
		}
		if sum.Counts[schema.StatusRetried] == 0 || sum.GroupsWithVariance == 0 {
			t.Fatalf("1 desktop: %d retried, %d groups with reward variance; want some of each", sum.Counts[schema.StatusRetried], sum.GroupsWithVariance)
		}

		eight := filepath.Join(base, "eight")
		if err := collectRun(t, eight, 8, 0); err != nil {
			t.Fatalf("8 desktops: %v", err)
		}
		if diff := gocmp.Diff(want, exported(t, eight)); diff != "" {
			t.Errorf("8 desktops exported other samples than 1 (-1 desktop +8):\n%s", diff)
		}

		resumed := filepath.Join(base, "resumed")
		if err := collectRun(t, resumed, 3, 20*time.Second); !errors.Is(err, context.Canceled) {
			t.Fatalf("stopped batch: %v, want context.Canceled", err)
		}
		stopped, _, err := export.Summarize(resumed)
		if err != nil {
			t.Fatal(err)
		}
		if stopped.Counts[schema.StatusOK] == 0 || stopped.Counts[schema.StatusOK] == len(equalityTasks())*4 {
			t.Fatalf("the stop at 20 s left %d ok attempts; move it into the middle of the batch", stopped.Counts[schema.StatusOK])
		}
		if err := collectRun(t, resumed, 3, 0); err != nil {
			t.Fatalf("resumed batch: %v", err)
		}
		if diff := gocmp.Diff(want, exported(t, resumed)); diff != "" {
			t.Errorf("the stopped and resumed batch exported other samples (-uninterrupted +resumed):\n%s", diff)
		}
	})
}
