package qwen

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"testing"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// imageTokens is what one screenshot costs in a Qwen-VL prompt: about a
// thousand tokens, so that 20 screenshots make a prompt of about 20k ids.
const imageTokens = 1000

// rolloutStats is what one attempt cost the model server's prefix cache
// and the run directory.
type rolloutStats struct {
	promptTokens, cachedTokens int
	// storeBytes is what the prompt ids added to tokens/; recordBytes what
	// their chunk hashes added to the records; inlineBytes what the ids
	// would have added to the records as JSON.
	storeBytes, recordBytes, inlineBytes int64
}

func (s rolloutStats) hitRate() float64 { return float64(s.cachedTokens) / float64(s.promptTokens) }

// runRollout plays one attempt of steps model calls: the harness's prompts
// go to the scripted vLLM server through the policy client, and each
// step's prompt ids are stored in a run directory as collect stores them.
func runRollout(tb testing.TB, eviction Eviction, steps int) rolloutStats {
	tb.Helper()
	srv := policytest.NewServer(policytest.Options{NoLatency: true, ImageTokens: imageTokens,
		Script: func(req policytest.Request) string {
			// An agent that never stops, clicking somewhere new each step.
			return fmt.Sprintf("Action: Click the next item.\n<tool_call>\n"+
				`{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [%d, %d]}}`+"\n</tool_call>",
				100+7*req.Step, 200+3*req.Step)
		}})
	defer srv.Close()
	c, err := policy.New(policy.Config{BaseURL: srv.URL(), Model: "qwen", HTTPClient: srv.Client()})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	dir := tb.TempDir()
	run, err := schema.Create(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer run.Close()

	var st rolloutStats
	ep := New(Config{Eviction: eviction}).NewEpisode(goldenTask)
	for i := 1; i <= steps; i++ {
		msgs, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(tb, 320, 200, uint64(i))})
		if err != nil {
			tb.Fatal(err)
		}
		res, err := c.Complete(tb.Context(), msgs)
		if err != nil {
			tb.Fatal(err)
		}
		if res.Model.CachedTokens == nil || len(res.PromptTokenIDs) != res.Model.PromptTokens {
			tb.Fatalf("step %d: cached %v, %d prompt ids for %d prompt tokens", i, res.Model.CachedTokens, len(res.PromptTokenIDs), res.Model.PromptTokens)
		}
		st.promptTokens += res.Model.PromptTokens
		st.cachedTokens += *res.Model.CachedTokens
		chunks, err := run.PutTokenIDs(res.PromptTokenIDs)
		if err != nil {
			tb.Fatal(err)
		}
		st.recordBytes += fieldBytes(tb, "prompt_token_chunks", chunks)
		st.inlineBytes += fieldBytes(tb, "prompt_token_ids", res.PromptTokenIDs)
		ep.Reply(policy.Reply{Content: res.Response.Content, Reasoning: res.Response.Reasoning, ToolCalls: res.ToolCalls})
	}
	if err := run.Close(); err != nil {
		tb.Fatal(err)
	}
	st.storeBytes = dirBytes(tb, filepath.Join(dir, schema.TokensDir))
	return st
}

// fieldBytes is the size of `,"name":value` in a record line.
func fieldBytes(tb testing.TB, name string, v any) int64 {
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return int64(len(`,"":`) + len(name) + len(b))
}

func dirBytes(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		n += fi.Size()
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestEvictionKeepsPrefixCache measures the scripted server's prefix-cache
// hit rate over a 40-step attempt: evicting half the screenshots at once
// keeps the prompt's prefix stable between evictions, evicting the oldest
// one every step past ImageMax changes it every step.
func TestEvictionKeepsPrefixCache(t *testing.T) {
	if testing.Short() {
		t.Skip("plays two 40-step attempts")
	}
	const steps = 40
	half := runRollout(t, EvictHalf, steps)
	oldest := runRollout(t, EvictOldest, steps)
	t.Logf("prefix-cache hit rate over a %d-step attempt: half %.3f (%d of %d prompt tokens), oldest %.3f (%d of %d)",
		steps, half.hitRate(), half.cachedTokens, half.promptTokens, oldest.hitRate(), oldest.cachedTokens, oldest.promptTokens)
	if half.hitRate() < oldest.hitRate()+0.2 {
		t.Errorf("hit rate evicting half at once %.3f, one at a time %.3f: want the first well above", half.hitRate(), oldest.hitRate())
	}
	// Until step ImageMax both are the same attempt: every step extends
	// the previous prompt and the cache serves all of it.
	first := runRollout(t, EvictOldest, DefaultImageMax)
	if first.hitRate() < 0.9 {
		t.Errorf("hit rate over the first %d steps %.3f, want above 0.9", DefaultImageMax, first.hitRate())
	}
}

// BenchmarkRolloutPromptIDs reports what recording prompt token ids costs
// a 15-step attempt (the default --max-steps): bytes added to tokens/ and
// to rollouts.jsonl, against the ids written inline; and the prefix-cache
// hit rate of a 40-step attempt both ways of evicting.
func BenchmarkRolloutPromptIDs(b *testing.B) {
	var st rolloutStats
	for b.Loop() {
		st = runRollout(b, EvictHalf, 15)
	}
	b.ReportMetric(float64(st.storeBytes), "store-bytes/rollout")
	b.ReportMetric(float64(st.recordBytes), "record-bytes/rollout")
	b.ReportMetric(float64(st.inlineBytes), "inline-bytes/rollout")
	b.ReportMetric(float64(st.promptTokens), "prompt-ids/rollout")
	b.ReportMetric(runRollout(b, EvictHalf, 40).hitRate(), "hit-rate-half-40")
	b.ReportMetric(runRollout(b, EvictOldest, 40).hitRate(), "hit-rate-oldest-40")
}
