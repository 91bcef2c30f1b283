package export_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// contiguousRun collects a small batch whose attempts take up to four
// steps, keeping imageMax screenshots in the prompt.
func contiguousRun(t *testing.T, imageMax int) string {
	t.Helper()
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "run")
	_, err := rl.Collect(t.Context(), equalityTasks(), rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1"},
		rl.CollectOptions{Out: dir, NewDesktop: fake.NewFleet(fake.Config{Width: 320, Height: 192, Seed: 3}).New,
			Desktops: 2, Group: 2, Harness: qwen.New(qwen.Config{ImageMax: imageMax}),
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportContiguous: each attempt becomes one sequence in which every
// step's prompt is a prefix, the generated ids sit under a loss mask of 1
// with their logprobs, and nothing else is masked in.
func TestExportContiguous(t *testing.T) {
	dir := contiguousRun(t, rl.MaxImageMax)
	out := filepath.Join(t.TempDir(), "seq.jsonl")
	st, err := export.ExportSteps(dir, out, export.Options{Contiguous: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != st.Rollouts || st.Lines == 0 {
		t.Fatalf("%d lines for %d rollouts, want one per rollout", st.Lines, st.Rollouts)
	}
	recs := map[string]schema.Record{}
	if _, err := schema.ReadRunRecords(dir, func(r schema.Record) error { recs[r.RolloutID] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	store, err := schema.OpenMessageStore(dir, schema.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<26)
	multi := 0
	for sc.Scan() {
		var s export.AttemptSample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		rec := recs[s.RolloutID]
		n := len(s.TokenIDs)
		if len(s.LossMask) != n || len(s.Logprobs) != n || len(s.StepStarts) != len(rec.Steps) {
			t.Fatalf("%s: %d ids, %d mask, %d logprobs, %d step starts for %d steps", s.RolloutID, n, len(s.LossMask), len(s.Logprobs), len(s.StepStarts), len(rec.Steps))
		}
		if len(rec.Steps) > 1 {
			multi++
		}
		var generated []int64
		for i, step := range rec.Steps {
			prompt, err := store.PromptTokenIDs(step)
			if err != nil {
				t.Fatal(err)
			}
			start := s.StepStarts[i]
			if !slices.Equal(s.TokenIDs[:start], prompt) {
				t.Errorf("%s step %d: the sequence up to the step is not its prompt", s.RolloutID, i)
			}
			ids := step.Response.TokenIDs
			if !slices.Equal(s.TokenIDs[start:start+len(ids)], ids) || !slices.Equal(s.Logprobs[start:start+len(ids)], step.Response.Logprobs) {
				t.Errorf("%s step %d: generated ids or logprobs not where the step starts", s.RolloutID, i)
			}
			generated = append(generated, ids...)
		}
		var masked []int64
		for k, m := range s.LossMask {
			if m == 1 {
				masked = append(masked, s.TokenIDs[k])
			}
		}
		if !slices.Equal(masked, generated) {
			t.Errorf("%s: the loss mask covers %d ids, not the %d generated ones", s.RolloutID, len(masked), len(generated))
		}
	}
	if multi == 0 {
		t.Fatal("no attempt took more than one step: the test proves nothing")
	}
}

// TestExportContiguousRefusesEvicted: with screenshots evicted from the
// prompt, prompts stop extending each other and the export says where.
func TestExportContiguousRefusesEvicted(t *testing.T) {
	dir := contiguousRun(t, 1)
	_, err := export.ExportSteps(dir, filepath.Join(t.TempDir(), "seq.jsonl"), export.Options{Contiguous: true})
	if !errors.Is(err, export.ErrNotContiguous) {
		t.Fatalf("export of an evicting run: %v, want ErrNotContiguous", err)
	}
}
