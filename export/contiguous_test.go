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

	"github.com/google/go-cmp/cmp"

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
			if step.PromptTokenCount != len(prompt) || len(prompt) == 0 {
				t.Errorf("%s step %d: prompt_token_count %d for %d ids", s.RolloutID, i, step.PromptTokenCount, len(prompt))
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

// TestExportPromptPrefix: per-step samples with PromptPrefix rebuild, from
// the sample before, exactly the prompts a whole export writes, in runs
// whose prompts extend each other and in runs that evict screenshots.
func TestExportPromptPrefix(t *testing.T) {
	for _, imageMax := range []int{rl.MaxImageMax, 1} {
		dir := contiguousRun(t, imageMax)
		wholeOut, prefixOut := filepath.Join(t.TempDir(), "whole.jsonl"), filepath.Join(t.TempDir(), "prefix.jsonl")
		if _, err := export.ExportSteps(dir, wholeOut, export.Options{}); err != nil {
			t.Fatal(err)
		}
		st, err := export.ExportSteps(dir, prefixOut, export.Options{PromptPrefix: true})
		if err != nil {
			t.Fatal(err)
		}
		whole, prefixed := readSamples(t, wholeOut), readSamples(t, prefixOut)
		if len(whole) != len(prefixed) || len(whole) == 0 {
			t.Fatalf("image max %d: %d samples whole, %d with prefixes", imageMax, len(whole), len(prefixed))
		}
		shared, partly := 0, 0
		var prev []int64
		for i, s := range prefixed {
			w := whole[i]
			if s.RolloutID != w.RolloutID || s.Step != w.Step {
				t.Fatalf("sample %d is %s/%d, whole export's %s/%d", i, s.RolloutID, s.Step, w.RolloutID, w.Step)
			}
			if s.Step == 0 && s.PromptPrefixIDs != 0 {
				t.Errorf("%s step 0 refers to a step before it", s.RolloutID)
			}
			if s.PromptPrefixIDs > len(prev) {
				t.Fatalf("%s step %d: a prefix of %d ids from a prompt of %d", s.RolloutID, s.Step, s.PromptPrefixIDs, len(prev))
			}
			prompt := append(slices.Clone(prev[:s.PromptPrefixIDs]), s.PromptTokenIDs...)
			if !slices.Equal(prompt, w.PromptTokenIDs) {
				t.Errorf("%s step %d: the rebuilt prompt differs from the whole export's", s.RolloutID, s.Step)
			}
			if s.PromptPrefixIDs > 0 {
				shared++
				if s.PromptPrefixIDs < len(prev) {
					partly++
				}
			}
			s.PromptPrefixIDs, s.PromptTokenIDs = 0, nil
			w.PromptTokenIDs = nil
			if diff := cmp.Diff(w, s); diff != "" {
				t.Errorf("%s step %d: other fields differ (-whole +prefixed):\n%s", s.RolloutID, s.Step, diff)
			}
			prev = prompt
		}
		if shared == 0 {
			t.Fatalf("image max %d: no sample shares a prefix: the test proves nothing", imageMax)
		}
		if imageMax == 1 && partly == 0 {
			t.Errorf("evicting run: no prefix shorter than the prompt before it")
		}
		if fi, err := os.Stat(wholeOut); err != nil || fi.Size() <= st.Bytes {
			t.Errorf("prefixed export %d bytes, not smaller than the whole one (%v)", st.Bytes, err)
		}
	}
	if _, err := export.ExportSteps(contiguousRun(t, rl.MaxImageMax), filepath.Join(t.TempDir(), "x.jsonl"), export.Options{PromptPrefix: true, Contiguous: true}); err == nil {
		t.Error("PromptPrefix with Contiguous: no error")
	}
}
