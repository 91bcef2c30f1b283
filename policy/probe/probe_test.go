package probe

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	always := policytest.FaultAlways
	tests := []struct {
		name string
		opts policytest.Options
		key  string
		// imageMax is the probe's --image-max; 0 means the default.
		imageMax int
		// want is the verdict; wantAdvice substrings of the advice, in
		// order.
		wantTrainable bool
		wantIDs       schema.TokenIDSource
		wantPromptIDs bool
		wantCache     [2]bool // reported, hit
		wantLimit     int
		wantAdvice    []string
	}{
		{name: "vllm", opts: policytest.Options{Dialect: policytest.VLLM},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"--logprobs-mode processed_logprobs"}},
		{name: "vllm-0.10.2", opts: policytest.Options{Dialect: policytest.VLLM, Version: policytest.VLLM0102},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"--logprobs-mode processed_logprobs"}},
		{name: "vllm-0.10.1", opts: policytest.Options{Dialect: policytest.VLLM, Version: policytest.VLLM0101},
			wantTrainable: true, wantIDs: schema.SourceTokensAsIDs, wantCache: [2]bool{true, true},
			wantAdvice: []string{"upgrade to vLLM 0.10.2 or later (return_token_ids) to record them", "--logprobs-mode processed_logprobs"}},
		// Reporting on, but nothing cached yet: vLLM 0.10 sends null, so
		// the first requests say nothing; the repeat's hit shows it.
		{name: "vllm-no-prompt-tokens-details", opts: policytest.Options{Dialect: policytest.VLLM, Version: policytest.VLLM0102, NoCacheReport: true},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true,
			wantAdvice: []string{"--enable-prompt-tokens-details", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-image-limit", opts: policytest.Options{Dialect: policytest.VLLM, ImageLimit: 4},
			wantTrainable: false, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true}, wantLimit: 4,
			wantAdvice: []string{`--limit-mm-per-prompt '{"image": 20}', or collect (and probe) with --image-max 4`, "--logprobs-mode processed_logprobs"}},
		{name: "vllm-0.10.1-image-limit-within-image-max", opts: policytest.Options{Dialect: policytest.VLLM, Version: policytest.VLLM0101, ImageLimit: 8}, imageMax: 8,
			wantTrainable: true, wantIDs: schema.SourceTokensAsIDs, wantCache: [2]bool{true, true},
			wantAdvice: []string{"upgrade to vLLM 0.10.2", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-0.10.1-image-limit", opts: policytest.Options{Dialect: policytest.VLLM, Version: policytest.VLLM0101, ImageLimit: 1},
			wantTrainable: false, wantIDs: schema.SourceTokensAsIDs, wantCache: [2]bool{true, true}, wantLimit: 1,
			wantAdvice: []string{"refuses more than 1 image(s)", "upgrade to vLLM 0.10.2", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-ignores-return-token-ids", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultIgnoreField)},
			wantTrainable: true, wantIDs: schema.SourceTokensAsIDs, wantCache: [2]bool{true, true},
			wantAdvice: []string{"upgrade to vLLM 0.10.2", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-no-logprobs", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultNoLogprobs)},
			wantTrainable: false, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"no logprobs", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-misaligned", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultLogprobsMismatch)},
			wantTrainable: false, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"differ in length", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-null-logprobs", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultNullLogprobs)},
			wantTrainable: false, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"null (how vLLM and SGLang send NaN)", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-text-only", opts: policytest.Options{Dialect: policytest.VLLM, TextOnly: true},
			wantTrainable: false, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"serve a vision-language model", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-wrong-key", opts: policytest.Options{Dialect: policytest.VLLM, APIKey: "right"}, key: "wrong",
			wantTrainable: false,
			wantAdvice:    []string{"the text request failed"}},
		// The server answers every request but the repeat, which gets a
		// 500: that says nothing about cache reporting.
		{name: "vllm-repeat-fails", opts: policytest.Options{Dialect: policytest.VLLM, Faults: failRepeat()},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true,
			wantAdvice: []string{"the repeated request failed (see above), so cached-token reporting and prefix caching were not checked", "--logprobs-mode processed_logprobs"}},
		{name: "sglang", opts: policytest.Options{Dialect: policytest.SGLang},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true, wantCache: [2]bool{true, true}},
		{name: "sglang-0.5.13", opts: policytest.Options{Dialect: policytest.SGLang, Version: policytest.SGLang0513},
			wantTrainable: true, wantIDs: schema.SourceMetaInfo, wantPromptIDs: true, wantCache: [2]bool{true, true},
			wantAdvice: []string{"exact through SGLang's return_meta_info"}},
		{name: "sglang-0.4", opts: policytest.Options{Dialect: policytest.SGLang, Version: policytest.SGLang04},
			wantTrainable: false, wantIDs: schema.SourceStrings, wantCache: [2]bool{true, true},
			wantAdvice: []string{"not exact: this SGLang returns token strings only: upgrade SGLang to 0.5.13"}},
		// SGLang's image counts come with cached_tokens 0 whatever the
		// cache report: not a report.
		{name: "sglang-no-cache-report", opts: policytest.Options{Dialect: policytest.SGLang, NoCacheReport: true},
			wantTrainable: true, wantIDs: schema.SourceReturnTokenIDs, wantPromptIDs: true,
			wantAdvice: []string{"--enable-cache-report"}},
		{name: "openai", opts: policytest.Options{Dialect: policytest.OpenAI},
			wantTrainable: false, wantIDs: schema.SourceStrings, wantCache: [2]bool{true, true},
			wantAdvice: []string{"not exact: the server refuses return_token_ids, return_tokens_as_token_ids, return_meta_info and return_prompt_token_ids (a hosted API?)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				tt.opts.Model = "qwen"
				srv := policytest.NewPipeServer(tt.opts)
				defer srv.Close()
				r, err := Run(t.Context(), policy.Config{BaseURL: srv.URL(), Model: "qwen", APIKey: tt.key, HTTPClient: srv.Client()},
					Options{ImageMax: tt.imageMax})
				if err != nil {
					t.Fatal(err)
				}
				got := [7]any{r.Trainable, r.TokenIDs, r.PromptTokenIDs, r.CacheReported, r.CacheHit, r.ImageLimit, r.Server}
				want := [7]any{tt.wantTrainable, tt.wantIDs, tt.wantPromptIDs, tt.wantCache[0], tt.wantCache[1], tt.wantLimit, string(tt.opts.Dialect)}
				if tt.opts.Dialect == policytest.OpenAI {
					want[6] = "system"
				}
				if tt.key != "" {
					want[6] = "" // /v1/models refused the key too
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("{trainable, token ids, prompt ids, cache reported, cache hit, image limit, server} (-want +got):\n%s", diff)
				}
				if len(r.Advice) != len(tt.wantAdvice) {
					t.Errorf("advice %q, want %d items", r.Advice, len(tt.wantAdvice))
				}
				for i, w := range tt.wantAdvice {
					if i < len(r.Advice) && !strings.Contains(r.Advice[i], w) {
						t.Errorf("advice %d = %q, want it to say %q", i, r.Advice[i], w)
					}
				}
				var out bytes.Buffer
				if err := r.WriteTable(&out); err != nil {
					t.Fatal(err)
				}
				golden(t, filepath.Join("testdata", tt.name+".golden"), out.Bytes())
			})
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// failRepeat returns a policytest.Options.Faults that fails the probe's
// repeat request, its second request without images, with a 500.
func failRepeat() func(int, policytest.Request) policytest.Fault {
	textOnly := 0
	return func(_ int, req policytest.Request) policytest.Fault {
		if req.Images > 0 {
			return policytest.NoFault
		}
		textOnly++
		if textOnly == 2 {
			return policytest.FaultServerError
		}
		return policytest.NoFault
	}
}
