package rl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

func TestEnvironmentChanges(t *testing.T) {
	fakeEnv := func(knobs ...string) *schema.Environment {
		e := &schema.Environment{Backend: "fake", Knobs: map[string]string{}}
		for i := 0; i < len(knobs); i += 2 {
			e.Knobs[knobs[i]] = knobs[i+1]
		}
		return e
	}
	tests := []struct {
		name     string
		old, new *schema.Environment
		want     []string
	}{
		{"same", fakeEnv("fake-success", "0.5"), fakeEnv("fake-success", "0.5"), nil},
		{"not recorded", nil, fakeEnv("fake-success", "0.5"), nil},
		{"neither described", nil, nil, nil},
		{"another value", fakeEnv("fake-success", "0.5", "fake-seed", "1"), fakeEnv("fake-success", "0.9", "fake-seed", "2"),
			[]string{"--fake-seed 1, not 2", "--fake-success 0.5, not 0.9"}},
		{"a knob gone and one new", fakeEnv("fake-flaky", "t1"), fakeEnv("fake-seed", "1"),
			[]string{"--fake-flaky t1, not unset", "--fake-seed unset, not 1"}},
		{"an empty value", fakeEnv("cmdline", ""), fakeEnv("cmdline", "quiet"), []string{`--cmdline "", not quiet`}},
		{"another backend", fakeEnv("fake-seed", "1"), &schema.Environment{Backend: "osworld", Knobs: map[string]string{"grader": "bridge"}},
			[]string{"--backend fake, not osworld"}},
		{"undescribed", fakeEnv(), nil, []string{`desktops of backend "fake", not undescribed ones (CollectOptions.Environment)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, environmentChanges(tt.old, tt.new)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestCollectResumeOtherEnvironment continues a batch on other desktops:
// refused, naming the backend; on the same, accepted; a batch.json that
// records none (an older legato) is continued with a warning that the
// environment could not be checked, and records this run's.
func TestCollectResumeOtherEnvironment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1)}, fake.Config{DefaultReward: fake.Reward{P: 1}})
		e.opts.Group = 1
		e.opts.Environment = &schema.Environment{Backend: "fake", Knobs: map[string]string{"fake-success": "0.5"}}
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		other := e.opts
		other.Environment = &schema.Environment{Backend: "osworld", Knobs: map[string]string{"grader": "bridge"}}
		_, err := Collect(t.Context(), e.tasks, e.pol, other)
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "--backend fake, not osworld") {
			t.Errorf("resume on another backend: %v; want a refusal naming it", err)
		}
		if _, err := e.collect(t.Context()); err != nil {
			t.Errorf("resume on the same desktops: %v", err)
		}

		path := filepath.Join(e.opts.Out, schema.BatchFile)
		b, err := schema.ReadBatch(e.opts.Out)
		if err != nil {
			t.Fatal(err)
		}
		b.Environment = nil
		data, _ := json.Marshal(b)
		if err := os.WriteFile(path, data, 0o666); err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		e.opts.Logger = slog.New(slog.NewTextHandler(&log, nil))
		if _, err := e.collect(t.Context()); err != nil {
			t.Errorf("resume of a batch.json without the environment: %v", err)
		}
		if !strings.Contains(log.String(), "the environment could not be checked") {
			t.Errorf("no warning that the environment could not be checked:\n%s", log.String())
		}
		if b, err := schema.ReadBatch(e.opts.Out); err != nil || b.Environment == nil || b.Environment.Backend != "fake" {
			t.Errorf("batch.json after: %+v, %v; want this run's environment recorded", b, err)
		}
	})
}

// TestServeRestartOtherEnvironment restarts a service on other desktops:
// refused, naming the knob, as collect refuses; on the same, it runs.
func TestServeRestartOtherEnvironment(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.opts.Environment = &schema.Environment{Backend: "fake", Knobs: map[string]string{"fake-seed": "1"}}
	if _, err := e.serve(t).Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	other := e.opts
	other.Environment = &schema.Environment{Backend: "fake", Knobs: map[string]string{"fake-seed": "2"}}
	if s, err := Serve(t.Context(), e.pol, other); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "--fake-seed 1, not 2") {
		if s != nil {
			s.Close(context.Background())
		}
		t.Errorf("restart with another --fake-seed: %v; want a refusal naming it", err)
	}
	if _, err := e.serve(t).Close(context.Background()); err != nil {
		t.Errorf("restart on the same desktops: %v", err)
	}
}
