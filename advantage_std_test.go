package rl

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// groupRewards are the rewards of g's finished attempts, in its order.
func groupRewards(g Group) []float64 {
	var out []float64
	for _, r := range g.Finished {
		out = append(out, *r.Reward)
	}
	return out
}

// checkSampleStdGroups checks that every group OnGroup got has the sample
// std's advantages and says so, and that at least one of them has
// unequal rewards, whose advantages the two stds tell apart.
func checkSampleStdGroups(t *testing.T, groups []Group) {
	t.Helper()
	unequal := 0
	for _, g := range groups {
		rewards := groupRewards(g)
		if g.AdvantageStd != schema.SampleStd {
			t.Errorf("group %s: AdvantageStd %q, want sample", g.ID, g.AdvantageStd)
		}
		if diff := cmp.Diff(export.Advantages(rewards, schema.SampleStd), g.Advantages, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
			t.Errorf("group %s rewards %v: advantages (-sample std +OnGroup):\n%s", g.ID, rewards, diff)
		}
		if slicesDiffer(export.Advantages(rewards, schema.SampleStd), export.Advantages(rewards, schema.PopulationStd)) {
			unequal++
		}
	}
	if unequal == 0 {
		t.Fatalf("no group of %d has unequal rewards: the check tells neither std apart; change the fake's seed", len(groups))
	}
}

func slicesDiffer(a, b []float64) bool { return !cmp.Equal(a, b, cmpopts.EquateApprox(0, 1e-9)) }

// TestCollectAdvantageStd: a batch collected with the sample std records it
// in batch.json and gives OnGroup its advantages; continuing the batch
// without saying keeps it, and continuing it with the population std is
// refused, naming the setting.
func TestCollectAdvantageStd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), policytest.Options{}, fake.Config{DefaultReward: fake.Reward{P: 0.5}})
		e.opts.Group = 4
		e.opts.AdvantageStd = schema.SampleStd
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		checkSampleStdGroups(t, e.seenGroups())
		if b, err := schema.ReadBatch(e.opts.Out); err != nil || b.AdvantageStd != schema.SampleStd {
			t.Fatalf("batch.json: %+v, %v; want advantage_std sample", b, err)
		}

		// A resume without the setting delivers the ended groups again,
		// with the batch's std.
		e.opts.AdvantageStd = ""
		e.groups = nil
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatalf("resume without --advantage-std: %v", err)
		}
		checkSampleStdGroups(t, e.seenGroups())
		if b, err := schema.ReadBatch(e.opts.Out); err != nil || b.AdvantageStd != schema.SampleStd {
			t.Fatalf("batch.json after the resume: %+v, %v; want advantage_std sample kept", b, err)
		}

		e.opts.AdvantageStd = schema.PopulationStd
		_, err := e.collect(t.Context())
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "--advantage-std sample, not population") {
			t.Errorf("resume with --advantage-std population: %v, want a refusal naming both", err)
		}
	})
}

// TestCollectAdvantageStdOlderBatchFile: a batch.json written before the
// setting was recorded had population-std advantages: a resume without
// the setting records population, and one asking for the sample std is
// refused.
func TestCollectAdvantageStdOlderBatchFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		if b, err := schema.ReadBatch(e.opts.Out); err != nil || b.AdvantageStd != schema.PopulationStd {
			t.Fatalf("batch.json of a new batch: %+v, %v; want advantage_std population recorded", b, err)
		}
		path := filepath.Join(e.opts.Out, schema.BatchFile)
		var m map[string]any
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &m)
		}
		if err != nil {
			t.Fatal(err)
		}
		delete(m, "advantage_std")
		if data, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o666); err != nil {
			t.Fatal(err)
		}

		e.opts.AdvantageStd = schema.SampleStd
		if _, err := e.collect(t.Context()); err == nil || !strings.Contains(err.Error(), "--advantage-std population, not sample") {
			t.Errorf("resume of an older batch.json with --advantage-std sample: %v, want a refusal", err)
		}
		e.opts.AdvantageStd = ""
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatalf("resume of an older batch.json: %v", err)
		}
		if b, err := schema.ReadBatch(e.opts.Out); err != nil || b.AdvantageStd != schema.PopulationStd {
			t.Errorf("batch.json after the resume: %+v, %v; want advantage_std population", b, err)
		}
	})
}

// TestServiceAdvantageStd: a service run with the sample std gives it in
// every ended group's result, with its advantages; its journal keeps it,
// so a restart without the setting keeps it, one with the population std
// is refused, and export and the schema read it from the journal.
func TestServiceAdvantageStd(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.opts.AdvantageStd = schema.SampleStd
	s := e.serve(t)
	var ids []string
	for i := range 3 {
		ids = append(ids, submitClosed(t, s, GroupRequest{Task: inlineTask(i), Size: 4}).ID)
	}
	check := func(s *Service) {
		t.Helper()
		unequal := 0
		for _, id := range ids {
			res, err := s.Result(id, ResultOptions{Steps: StepsNone})
			if err != nil {
				t.Fatal(err)
			}
			if res.AdvantageStd != schema.SampleStd {
				t.Errorf("group %s: advantage_std %q, want sample", id, res.AdvantageStd)
			}
			var rewards, got []float64
			for _, a := range res.Attempts {
				if !a.Masked {
					rewards, got = append(rewards, *a.Reward), append(got, *a.Advantage)
				}
			}
			want := export.Advantages(rewards, schema.SampleStd)
			if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("group %s rewards %v: advantages (-sample std +result):\n%s", id, rewards, diff)
			}
			if slicesDiffer(want, export.Advantages(rewards, schema.PopulationStd)) {
				unequal++
			}
		}
		if unequal == 0 {
			t.Fatal("no group has unequal rewards: the check tells neither std apart; change the fake's seed")
		}
	}
	check(s)
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if k, err := schema.RecordedAdvantageStd(e.opts.Out); err != nil || k != schema.SampleStd {
		t.Errorf("schema.RecordedAdvantageStd of the service's directory: %q, %v; want sample from its journal", k, err)
	}
	st, err := export.ExportSteps(e.opts.Out, filepath.Join(t.TempDir(), "train.jsonl"), export.Options{AllowMissingLogprobs: true})
	if err != nil || st.AdvantageStd != schema.SampleStd {
		t.Errorf("export of the service's directory: std %q, %v; want the journal's sample", st.AdvantageStd, err)
	}

	e.opts.AdvantageStd = schema.PopulationStd
	if s, err := Serve(t.Context(), e.pol, e.opts); err == nil || !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "--advantage-std sample, not population") {
		if s != nil {
			s.Close(context.Background())
		}
		t.Errorf("restart with --advantage-std population: %v, want a refusal naming both", err)
	}
	e.opts.AdvantageStd = ""
	s2 := e.serve(t)
	defer s2.Close(context.Background())
	check(s2)
}
