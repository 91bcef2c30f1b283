package probe

import (
	"bytes"
	"errors"
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
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	always := policytest.FaultAlways
	tests := []struct {
		name string
		opts policytest.Options
		key  string
		// want is the verdict; wantAdvice substrings of the advice, in
		// order.
		wantTrainable bool
		wantIDs       policy.TokenIDSupport
		wantCache     [2]bool // reported, hit
		wantAdvice    []string
	}{
		{name: "vllm", opts: policytest.Options{Dialect: policytest.VLLM},
			wantTrainable: true, wantIDs: policy.TokenIDsReturned, wantCache: [2]bool{true, true},
			wantAdvice: []string{"--logprobs-mode processed_logprobs"}},
		{name: "vllm-no-prompt-tokens-details", opts: policytest.Options{Dialect: policytest.VLLM, NoCacheReport: true},
			wantTrainable: true, wantIDs: policy.TokenIDsReturned,
			wantAdvice: []string{"--enable-prompt-tokens-details", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-too-old-for-token-ids", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultIgnoreField)},
			wantTrainable: true, wantIDs: policy.TokenIDsIgnored, wantCache: [2]bool{true, true},
			wantAdvice: []string{"supports return_token_ids", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-no-logprobs", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultNoLogprobs)},
			wantTrainable: false, wantIDs: policy.TokenIDsReturned, wantCache: [2]bool{true, true},
			wantAdvice: []string{"no logprobs", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-misaligned", opts: policytest.Options{Dialect: policytest.VLLM, Faults: always(policytest.FaultLogprobsMismatch)},
			wantTrainable: true, wantIDs: policy.TokenIDsReturned, wantCache: [2]bool{true, true},
			wantAdvice: []string{"differ in length", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-text-only", opts: policytest.Options{Dialect: policytest.VLLM, TextOnly: true},
			wantTrainable: false, wantIDs: policy.TokenIDsReturned, wantCache: [2]bool{true, true},
			wantAdvice: []string{"serve a vision-language model", "--logprobs-mode processed_logprobs"}},
		{name: "vllm-wrong-key", opts: policytest.Options{Dialect: policytest.VLLM, APIKey: "right"}, key: "wrong",
			wantTrainable: false, wantIDs: policy.TokenIDsUnknown,
			wantAdvice: []string{"the text request failed"}},
		{name: "sglang", opts: policytest.Options{Dialect: policytest.SGLang},
			wantTrainable: true, wantIDs: policy.TokenIDsReturned, wantCache: [2]bool{true, true}},
		{name: "sglang-no-cache-report", opts: policytest.Options{Dialect: policytest.SGLang, NoCacheReport: true},
			wantTrainable: true, wantIDs: policy.TokenIDsReturned,
			wantAdvice: []string{"--enable-cache-report"}},
		{name: "openai", opts: policytest.Options{Dialect: policytest.OpenAI},
			wantTrainable: true, wantIDs: policy.TokenIDsRefused, wantCache: [2]bool{true, true},
			wantAdvice: []string{"refuses return_token_ids"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				tt.opts.Model = "qwen"
				srv := policytest.NewPipeServer(tt.opts)
				defer srv.Close()
				r, err := Run(t.Context(), policy.Config{BaseURL: srv.URL(), Model: "qwen", APIKey: tt.key, HTTPClient: srv.Client()})
				if err != nil {
					t.Fatal(err)
				}
				got := [5]any{r.Trainable, r.TokenIDs, r.CacheReported, r.CacheHit, r.Server}
				want := [5]any{tt.wantTrainable, tt.wantIDs, tt.wantCache[0], tt.wantCache[1], string(tt.opts.Dialect)}
				if tt.opts.Dialect == policytest.OpenAI {
					want[4] = "system"
				}
				if tt.key != "" {
					want[4] = "" // /v1/models refused the key too
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("{trainable, token ids, cache reported, cache hit, server} (-want +got):\n%s", diff)
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

func TestProbeMain(t *testing.T) {
	const key = "sk-probe-secret-5150"
	tests := []struct {
		name      string
		opts      policytest.Options
		env       string
		wantErr   error
		wantInOut string
	}{
		{"trainable with the key from the environment", policytest.Options{APIKey: key}, key, nil, "verdict: trainable"},
		{"no logprobs exits non-zero", policytest.Options{Faults: policytest.FaultAlways(policytest.FaultNoLogprobs)}, "", ErrNotTrainable, "verdict: NOT trainable"},
		{"missing key exits non-zero", policytest.Options{APIKey: key}, "", ErrNotTrainable, "401 Unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(KeyEnv, tt.env)
			tt.opts.NoLatency = true
			srv := policytest.NewServer(tt.opts)
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			err := Main(t.Context(), []string{"--policy-url", srv.URL(), "--model", "qwen", "--step-timeout", "5s"}, &stdout, &stderr)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Errorf("Main() = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(stdout.String(), tt.wantInOut) {
				t.Errorf("stdout does not say %q:\n%s", tt.wantInOut, stdout.String())
			}
			if all := stdout.String() + stderr.String() + errString(err); strings.Contains(all, key) {
				t.Errorf("the key appears in the output:\n%s", all)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestMainUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no flags", nil, "BaseURL is empty"},
		{"no model", []string{"--policy-url", "http://127.0.0.1:1/v1"}, "Model is empty"},
		{"key as a flag", []string{"--api-key", "x"}, "flag provided but not defined: -api-key"},
		{"stray argument", []string{"--model", "m", "extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := Main(t.Context(), tt.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Main(%q) = %v, want an error saying %q", tt.args, err, tt.want)
			}
		})
	}
}
