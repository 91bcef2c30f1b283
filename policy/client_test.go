package policy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const instruction = "Open the terminal and list the files"

// prompt is a first step: system prompt, instruction and screenshot.
func prompt() []schema.Message {
	return []schema.Message{
		{Role: "system", Content: []schema.Part{schema.TextPart("You operate a Linux desktop. Answer with one tool call per step.")}},
		{Role: "user", Content: []schema.Part{schema.TextPart(instruction), schema.ImagePart("data:image/png;base64,iVBORw0KGgo=")}},
	}
}

// newClient returns a client of srv; it is closed when the test ends.
func newClient(t *testing.T, srv *policytest.Server, cfg policy.Config) *policy.Client {
	t.Helper()
	cfg.BaseURL = srv.URL()
	if cfg.Model == "" {
		cfg.Model = "qwen"
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = srv.Client()
	}
	c, err := policy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// wantResponse is what a client should record for reply text, by the
// scripted server's own tokenizer, when its ids came from src.
func wantResponse(reply string, src schema.TokenIDSource) schema.Response {
	r := schema.Response{Content: reply, FinishReason: "stop", TokenIDsSource: src}
	for _, tok := range policytest.Tokenize(reply) {
		r.Logprobs = append(r.Logprobs, tok.Logprob)
		if src.Exact() {
			r.TokenIDs = append(r.TokenIDs, tok.ID)
		} else {
			r.Tokens = append(r.Tokens, tok.Text)
		}
	}
	return r
}

// The request fields of each way to ask for ids.
var (
	withIDs      = []string{"logprobs", "messages", "model", "return_token_ids"}
	withFallback = []string{"logprobs", "messages", "model", "return_meta_info", "return_prompt_token_ids", "return_tokens_as_token_ids"}
	withAsIDs    = []string{"logprobs", "messages", "model", "return_tokens_as_token_ids"}
	withMetaInfo = []string{"logprobs", "messages", "model", "return_meta_info", "return_prompt_token_ids"}
	withoutIDs   = []string{"logprobs", "messages", "model"}
)

// TestCompleteReleases runs two identical calls (siblings of a group)
// against every release the scripted server copies: the ids are exact
// wherever the release can give them at all, end with the end-of-turn id
// and line up with the logprobs; the client finds the way once and keeps
// it; prompt ids come back where the release has them; and a cached count
// is recorded only where the answer shows one.
func TestCompleteReleases(t *testing.T) {
	// A character split into byte tokens: token strings would read U+FFFD.
	const reply = "Action: type ‘hello’.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"type\", \"text\": \"hello\"}}\n</tool_call>"
	type cache int
	const (
		unknown cache = iota // not recorded: the answer did not say
		zero                 // recorded as 0
		hit                  // recorded, above 0
	)
	tests := []struct {
		dialect policytest.Dialect
		version policytest.Version
		// wantSource is how ids came, for both calls.
		wantSource   schema.TokenIDSource
		wantAttempts [2]int
		wantPrompt   bool
		// wantCached is what the first call records; the second, a
		// sibling, hits the cache on every release.
		wantCached cache
		// wantFields are the request fields the server saw, per request.
		wantFields [][]string
	}{
		{policytest.VLLM, policytest.VLLM0101, schema.SourceTokensAsIDs, [2]int{2, 1}, false,
			hit, [][]string{withIDs, withFallback, withAsIDs}},
		{policytest.VLLM, policytest.VLLM0102, schema.SourceReturnTokenIDs, [2]int{1, 1}, true,
			unknown, [][]string{withIDs, withIDs}},
		{policytest.VLLM, policytest.Latest, schema.SourceReturnTokenIDs, [2]int{1, 1}, true,
			zero, [][]string{withIDs, withIDs}},
		{policytest.SGLang, policytest.SGLang04, schema.SourceStrings, [2]int{2, 1}, false,
			hit, [][]string{withIDs, withFallback, withoutIDs}},
		{policytest.SGLang, policytest.SGLang0513, schema.SourceMetaInfo, [2]int{2, 1}, true,
			hit, [][]string{withIDs, withFallback, withMetaInfo}},
		// An image count beside cached_tokens 0 says nothing of the cache.
		{policytest.SGLang, policytest.Latest, schema.SourceReturnTokenIDs, [2]int{1, 1}, true,
			unknown, [][]string{withIDs, withIDs}},
		// A hosted API refuses every field it does not know, naming them.
		{policytest.OpenAI, policytest.Latest, schema.SourceStrings, [2]int{3, 1}, false,
			zero, [][]string{withIDs, withFallback, withoutIDs, withoutIDs}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s-%s", tt.dialect, tt.version), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := policytest.NewPipeServer(policytest.Options{Dialect: tt.dialect, Version: tt.version,
					NoLatency: true, KeepRequests: true, Script: func(policytest.Request) string { return reply }})
				defer srv.Close()
				c := newClient(t, srv, policy.Config{})
				if got := c.TokenIDSource(); got != "" {
					t.Errorf("TokenIDSource() before any call = %q, want none", got)
				}
				want := wantResponse(reply, tt.wantSource)
				for i := range 2 {
					res, err := c.Complete(t.Context(), prompt())
					if err != nil {
						t.Fatalf("call %d: %v", i, err)
					}
					if diff := cmp.Diff(want, res.Response); diff != "" {
						t.Errorf("call %d: response (-want +got):\n%s", i, diff)
					}
					if ids := res.Response.TokenIDs; tt.wantSource.Exact() && ids[len(ids)-1] != policytest.EndOfTurn {
						t.Errorf("call %d: ids end with %d, want the end-of-turn id %d", i, ids[len(ids)-1], policytest.EndOfTurn)
					}
					var wantWarnings []string
					if !tt.wantSource.Exact() {
						wantWarnings = []string{policy.WarnNoExactTokenIDs}
					}
					if diff := cmp.Diff(wantWarnings, res.Warnings); diff != "" {
						t.Errorf("call %d: warnings (-want +got):\n%s", i, diff)
					}
					m := res.Model
					if n := len(policytest.Tokenize(reply)); m.Attempts != tt.wantAttempts[i] || m.PromptTokens == 0 || m.CompletionTokens != n {
						t.Errorf("call %d: model = %+v, want %d attempts and %d completion tokens", i, m, tt.wantAttempts[i], n)
					}
					got := unknown
					switch {
					case m.CachedTokens == nil:
					case *m.CachedTokens == 0:
						got = zero
					case *m.CachedTokens <= m.PromptTokens:
						got = hit
					default:
						t.Errorf("call %d: %d of %d prompt tokens cached", i, *m.CachedTokens, m.PromptTokens)
					}
					if wantCached := map[int]cache{0: tt.wantCached, 1: hit}[i]; got != wantCached {
						t.Errorf("call %d: cached tokens %v, want %v (0 unknown, 1 zero, 2 a hit)", i, got, wantCached)
					}
					if got := len(res.PromptTokenIDs); (got > 0) != tt.wantPrompt || (got > 0 && got != m.PromptTokens) {
						t.Errorf("call %d: %d prompt token ids for %d prompt tokens, want ids: %v", i, got, m.PromptTokens, tt.wantPrompt)
					}
					if res.StartedAt.IsZero() || m.QueueS != 0 {
						t.Errorf("call %d: StartedAt %v, QueueS %v; want a start and no queueing", i, res.StartedAt, m.QueueS)
					}
				}
				if got := c.TokenIDSource(); got != tt.wantSource {
					t.Errorf("TokenIDSource() = %q, want %q", got, tt.wantSource)
				}
				var fields [][]string
				for _, r := range srv.Requests() {
					fields = append(fields, r.Fields)
				}
				if diff := cmp.Diff(tt.wantFields, fields); diff != "" {
					t.Errorf("request fields (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestCompleteToolCallsAndReasoning(t *testing.T) {
	script := func(policytest.Request) string {
		return "<think>\nThe terminal is in the dock.\n</think>\nAction: open it.\n<tool_call>\n" +
			`{"name": "computer_use", "arguments": {"action": "double_click", "coordinate": [20, 500]}}` + "\n</tool_call>"
	}
	want := policy.Reply{
		Content:   "Action: open it.",
		Reasoning: "The terminal is in the dock.",
		ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: `{"action": "double_click", "coordinate": [20, 500]}`}},
	}
	for _, d := range []policytest.Dialect{policytest.VLLM, policytest.SGLang} {
		t.Run(string(d), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := policytest.NewPipeServer(policytest.Options{Dialect: d, NoLatency: true, Script: script, SplitReasoning: true, ToolCalls: true})
				defer srv.Close()
				res, err := newClient(t, srv, policy.Config{}).Complete(t.Context(), prompt())
				if err != nil {
					t.Fatal(err)
				}
				got := policy.Reply{Content: res.Response.Content, Reasoning: res.Response.Reasoning, ToolCalls: res.ToolCalls}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("reply (-want +got):\n%s", diff)
				}
				// Ids and logprobs cover everything generated, reasoning
				// and tool call included.
				if n := len(policytest.Tokenize(script(policytest.Request{}))); len(res.Response.TokenIDs) != n || len(res.Response.Logprobs) != n {
					t.Errorf("%d ids, %d logprobs; want %d of each", len(res.Response.TokenIDs), len(res.Response.Logprobs), n)
				}
				if res.Response.FinishReason != "tool_calls" {
					t.Errorf("finish reason %q, want tool_calls", res.Response.FinishReason)
				}
			})
		})
	}
}

func TestCompleteDataWarnings(t *testing.T) {
	tests := []struct {
		name         string
		fault        policytest.Fault
		wantWarnings []string
		// logprobsFor is how many logprobs are kept for n token ids.
		logprobsFor func(n int) int
	}{
		{"mismatch is flagged and kept", policytest.FaultLogprobsMismatch, []string{policy.WarnLogprobsMismatch}, func(n int) int { return n - 1 }},
		{"missing logprobs are flagged", policytest.FaultNoLogprobs, []string{policy.WarnNoLogprobs}, func(int) int { return 0 }},
		{"null logprobs are flagged and dropped, not zeros", policytest.FaultNullLogprobs, []string{policy.WarnNonFiniteLogprobs}, func(int) int { return 0 }},
		{"aligned", policytest.NoFault, nil, func(n int) int { return n }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Faults: policytest.FaultAlways(tt.fault)})
				defer srv.Close()
				res, err := newClient(t, srv, policy.Config{}).Complete(t.Context(), prompt())
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.wantWarnings, res.Warnings); diff != "" {
					t.Errorf("warnings (-want +got):\n%s", diff)
				}
				n := res.Model.CompletionTokens
				if len(res.Response.TokenIDs) != n || len(res.Response.Logprobs) != tt.logprobsFor(n) {
					t.Errorf("%d ids and %d logprobs for %d tokens, want %d and %d", len(res.Response.TokenIDs), len(res.Response.Logprobs), n, n, tt.logprobsFor(n))
				}
			})
		})
	}
}

// TestCompleteNonFiniteLogprobs answers over loopback HTTP with the forms a
// NaN or an overflow takes on the wire; none may decode as a number.
func TestCompleteNonFiniteLogprobs(t *testing.T) {
	tests := []struct {
		name    string
		logprob string // the JSON of the second token's logprob; "" leaves the field out
	}{
		{"null", "null"},
		{"NaN string", `"NaN"`},
		{"-Infinity string", `"-Infinity"`},
		{"Infinity string", `"Infinity"`},
		{"beyond float64", "-1e999"},
		{"missing", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			second := `{"token":"b"}`
			if tt.logprob != "" {
				second = `{"token":"b","logprob":` + tt.logprob + `}`
			}
			body := `{"choices":[{"message":{"content":"ab"},"finish_reason":"stop","token_ids":[1,2,3],` +
				`"logprobs":{"content":[{"token":"a","logprob":-0.5},` + second + `,{"token":"","logprob":-0.1}]}}],` +
				`"usage":{"prompt_tokens":5,"completion_tokens":3}}`
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, body)
			}))
			defer srv.Close()
			c, err := policy.New(policy.Config{BaseURL: srv.URL + "/v1", Model: "qwen", HTTPClient: srv.Client()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			res, err := c.Complete(t.Context(), prompt())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{policy.WarnNonFiniteLogprobs}, res.Warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if res.Response.Logprobs != nil {
				t.Errorf("logprobs %v, want none kept", res.Response.Logprobs)
			}
			if diff := cmp.Diff([]int64{1, 2, 3}, res.Response.TokenIDs); diff != "" {
				t.Errorf("token ids (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRetryPolicy(t *testing.T) {
	const step = 10 * time.Second
	seq := policytest.FaultSeq
	always := policytest.FaultAlways
	tests := []struct {
		name    string
		opts    policytest.Options
		retries int
		// wantErr is the sentinel; nil means success.
		wantErr       error
		wantStatus    int
		wantPermanent bool
		wantMessage   string
		wantAttempts  int
		wantElapsed   time.Duration
	}{
		{name: "hang is bounded by (retries+1)·step timeout", opts: policytest.Options{Faults: always(policytest.FaultHang)}, retries: 1,
			wantErr: policy.ErrTimeout, wantMessage: "no complete answer within 10s", wantAttempts: 2, wantElapsed: 2 * step},
		{name: "hang with two retries", opts: policytest.Options{Faults: always(policytest.FaultHang)}, retries: 2,
			wantErr: policy.ErrTimeout, wantAttempts: 3, wantElapsed: 3 * step},
		{name: "hang without retries", opts: policytest.Options{Faults: always(policytest.FaultHang)}, retries: 0,
			wantErr: policy.ErrTimeout, wantAttempts: 1, wantElapsed: step},
		{name: "hang once then answer", opts: policytest.Options{Faults: seq(policytest.FaultHang)}, retries: 1,
			wantAttempts: 2, wantElapsed: step},
		{name: "slow first byte past the timeout", opts: policytest.Options{Faults: always(policytest.FaultSlowFirstByte), FirstByteDelay: 15 * time.Second}, retries: 1,
			wantErr: policy.ErrTimeout, wantAttempts: 2, wantElapsed: 2 * step},
		{name: "slow first byte within the timeout", opts: policytest.Options{Faults: always(policytest.FaultSlowFirstByte), FirstByteDelay: 7 * time.Second}, retries: 1,
			wantAttempts: 1, wantElapsed: 7 * time.Second},
		{name: "500 once is retried after a backoff", opts: policytest.Options{Faults: seq(policytest.FaultServerError)}, retries: 1,
			wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "500 every time", opts: policytest.Options{Faults: always(policytest.FaultServerError)}, retries: 1,
			wantErr: policy.ErrServer, wantStatus: 500, wantMessage: "scripted internal server error", wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "500 with no retries", opts: policytest.Options{Faults: always(policytest.FaultServerError)}, retries: 0,
			wantErr: policy.ErrServer, wantStatus: 500, wantAttempts: 1},
		{name: "flat 500 body (old vLLM)", opts: policytest.Options{Faults: always(policytest.FaultFlatError)}, retries: 1,
			wantErr: policy.ErrServer, wantStatus: 500, wantMessage: "scripted internal server error", wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "flat 500 body (SGLang)", opts: policytest.Options{Dialect: policytest.SGLang, Faults: always(policytest.FaultServerError)}, retries: 0,
			wantErr: policy.ErrServer, wantStatus: 500, wantMessage: "scripted internal server error", wantAttempts: 1},
		{name: "429 waits for Retry-After", opts: policytest.Options{Faults: seq(policytest.FaultRateLimit), RetryAfter: 3 * time.Second}, retries: 1,
			wantAttempts: 2, wantElapsed: 3 * time.Second},
		{name: "429 Retry-After is capped at the step timeout", opts: policytest.Options{Faults: seq(policytest.FaultRateLimit), RetryAfter: 2 * time.Minute}, retries: 1,
			wantAttempts: 2, wantElapsed: step},
		{name: "429 every time", opts: policytest.Options{Faults: always(policytest.FaultRateLimit), RetryAfter: time.Second}, retries: 1,
			wantErr: policy.ErrRateLimited, wantStatus: 429, wantMessage: "rate limit", wantAttempts: 2, wantElapsed: time.Second},
		{name: "429 then hang stays within the bound", opts: policytest.Options{Faults: seq(policytest.FaultRateLimit, policytest.FaultHang), RetryAfter: 8 * time.Second}, retries: 1,
			wantErr: policy.ErrTimeout, wantAttempts: 2, wantElapsed: 8*time.Second + step},
		{name: "401 string body (vLLM --api-key)", opts: policytest.Options{Faults: always(policytest.FaultUnauthorizedString)}, retries: 1,
			wantErr: policy.ErrUnauthorized, wantStatus: 401, wantPermanent: true, wantMessage: "401 Unauthorized: Unauthorized (check the API key)", wantAttempts: 1},
		{name: "401 nested body (OpenAI)", opts: policytest.Options{Dialect: policytest.OpenAI, APIKey: "right-key"}, retries: 1,
			wantErr: policy.ErrUnauthorized, wantStatus: 401, wantPermanent: true, wantMessage: "Incorrect API key provided.", wantAttempts: 1},
		{name: "404 unknown model", opts: policytest.Options{Model: "other"}, retries: 1,
			wantErr: policy.ErrNotFound, wantStatus: 404, wantPermanent: true, wantMessage: "The model `qwen` does not exist.", wantAttempts: 1},
		{name: "400 is not retried", opts: policytest.Options{TextOnly: true}, retries: 1,
			wantErr: policy.ErrBadRequest, wantStatus: 400, wantPermanent: true, wantMessage: "not a multimodal model", wantAttempts: 1},
		{name: "refused field: retried once without it", opts: policytest.Options{Faults: always(policytest.FaultRefuseField)}, retries: 0,
			wantAttempts: 2},
		{name: "malformed JSON once", opts: policytest.Options{Faults: seq(policytest.FaultMalformedJSON)}, retries: 1,
			wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "malformed JSON every time", opts: policytest.Options{Faults: always(policytest.FaultMalformedJSON)}, retries: 1,
			wantErr: policy.ErrBadResponse, wantMessage: "not valid JSON", wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "body cut short once", opts: policytest.Options{Faults: seq(policytest.FaultTruncatedBody)}, retries: 1,
			wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "body cut short every time", opts: policytest.Options{Faults: always(policytest.FaultTruncatedBody)}, retries: 1,
			wantErr: policy.ErrConnection, wantMessage: "unexpected EOF", wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "aborted once is sent again", opts: policytest.Options{Faults: seq(policytest.FaultAbort)}, retries: 1,
			wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
		{name: "aborted every time (SGLang)", opts: policytest.Options{Dialect: policytest.SGLang, Faults: always(policytest.FaultAbort)}, retries: 1,
			wantErr: policy.ErrAborted, wantMessage: `finish_reason "abort"`, wantAttempts: 2, wantElapsed: 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				srv := policytest.NewPipeServer(tt.opts)
				defer srv.Close()
				c := newClient(t, srv, policy.Config{StepTimeout: step, Retries: tt.retries, APIKey: "a-key"})
				start := time.Now()
				res, err := c.Complete(t.Context(), prompt())
				elapsed := time.Since(start)

				if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if elapsed != tt.wantElapsed {
					t.Errorf("call took %v, want %v", elapsed, tt.wantElapsed)
				}
				if bound := time.Duration(tt.retries+1) * step; elapsed > bound {
					t.Errorf("call took %v, more than (retries+1)·step timeout = %v", elapsed, bound)
				}
				if res == nil || res.Model.Attempts != tt.wantAttempts {
					t.Fatalf("result = %+v, want %d attempts recorded", res, tt.wantAttempts)
				}
				if got := res.Model.Seconds; got != elapsed.Seconds() {
					t.Errorf("Model.Seconds = %v, want %v", got, elapsed.Seconds())
				}
				if got := srv.Stats().Requests; got != tt.wantAttempts {
					t.Errorf("server saw %d requests, want %d", got, tt.wantAttempts)
				}
				if err == nil {
					return
				}
				var pe *policy.Error
				if !errors.As(err, &pe) {
					t.Fatalf("err is %T, want *policy.Error", err)
				}
				if pe.Status != tt.wantStatus || pe.Permanent != tt.wantPermanent || pe.Attempts != tt.wantAttempts {
					t.Errorf("error = {Status %d, Permanent %v, Attempts %d}, want {%d, %v, %d}", pe.Status, pe.Permanent, pe.Attempts, tt.wantStatus, tt.wantPermanent, tt.wantAttempts)
				}
				msg := err.Error()
				if !strings.Contains(msg, tt.wantMessage) || !strings.Contains(msg, srv.URL()+"/chat/completions") || !strings.Contains(msg, `model "qwen"`) {
					t.Errorf("error %q should name the URL, the model and %q", msg, tt.wantMessage)
				}
				if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Errorf("error %v wraps a ctx error although the caller's ctx is live", err)
				}
			})
		})
	}
}

func TestCompleteCancel(t *testing.T) {
	t.Run("caller cancels a hanging call", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Faults: policytest.FaultAlways(policytest.FaultHang)})
			defer srv.Close()
			c := newClient(t, srv, policy.Config{Retries: 3})
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(3*time.Second, cancel)
			start := time.Now()
			res, err := c.Complete(ctx, prompt())
			if !errors.Is(err, context.Canceled) || errors.Is(err, policy.ErrTimeout) {
				t.Errorf("err = %v, want context.Canceled only", err)
			}
			if got := time.Since(start); got != 3*time.Second {
				t.Errorf("returned after %v, want 3s", got)
			}
			if res == nil || res.Model.Attempts != 1 || res.Model.Seconds != 3 {
				t.Errorf("result = %+v, want 1 attempt of 3 s", res)
			}
		})
	})
	t.Run("caller deadline before the step timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Faults: policytest.FaultAlways(policytest.FaultHang)})
			defer srv.Close()
			c := newClient(t, srv, policy.Config{Retries: 1})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err := c.Complete(ctx, prompt())
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, policy.ErrTimeout) {
				t.Errorf("err = %v, want the caller's context.DeadlineExceeded", err)
			}
		})
	})
	t.Run("caller cancels while queued", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Faults: policytest.FaultSeq(policytest.FaultHang)})
			defer srv.Close()
			c := newClient(t, srv, policy.Config{MaxInflight: 1, StepTimeout: time.Minute})
			first := make(chan error, 1)
			go func() {
				_, err := c.Complete(t.Context(), prompt())
				first <- err
			}()
			synctest.Wait() // the first call holds the only slot
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			res, err := c.Complete(ctx, prompt())
			if !errors.Is(err, context.DeadlineExceeded) || res != nil {
				t.Errorf("queued call: res %v, err %v; want no result and the caller's deadline", res, err)
			}
			if got := c.InFlight(); got != 1 {
				t.Errorf("InFlight() = %d, want 1 (the queued call never started)", got)
			}
			if err := <-first; !errors.Is(err, policy.ErrTimeout) {
				t.Errorf("first call: %v, want a timeout", err)
			}
		})
	})
}

func TestMaxInflight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			maxSeen int
			c       *policy.Client
		)
		srv := policytest.NewPipeServer(policytest.Options{
			// One second per request whatever the load.
			Latency: policytest.Latency{Base: time.Second, Knee: 1 << 30},
			Script: func(r policytest.Request) string {
				mu.Lock()
				maxSeen = max(maxSeen, c.InFlight())
				mu.Unlock()
				return policytest.DefaultScript(r)
			},
		})
		defer srv.Close()
		c = newClient(t, srv, policy.Config{MaxInflight: 2})
		const calls = 6
		results := make(chan *policy.Result, calls)
		for range calls {
			go func() {
				res, err := c.Complete(t.Context(), prompt())
				if err != nil {
					t.Error(err)
				}
				results <- res
			}()
		}
		var queued, seconds []float64
		for range calls {
			res := <-results
			queued = append(queued, res.Model.QueueS)
			seconds = append(seconds, res.Model.Seconds)
		}
		slices.Sort(queued)
		if diff := cmp.Diff([]float64{0, 0, 1, 1, 2, 2}, queued); diff != "" {
			t.Errorf("queue seconds (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]float64{1, 1, 1, 1, 1, 1}, seconds); diff != "" {
			t.Errorf("model seconds exclude queueing (-want +got):\n%s", diff)
		}
		if got := srv.Stats().MaxInFlight; got != 2 {
			t.Errorf("server saw %d requests in flight at most, want 2", got)
		}
		if maxSeen != 2 || c.InFlight() != 0 {
			t.Errorf("InFlight() peaked at %d and ends at %d, want 2 and 0", maxSeen, c.InFlight())
		}
	})
}

func TestKeyNeverLeaks(t *testing.T) {
	const key = "sk-legato-7f3a9c-do-not-print"
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var out []string
	record := func(res *policy.Result, err error) {
		if err != nil {
			out = append(out, err.Error(), fmt.Sprintf("%v|%+v|%#v|%s", err, err, err, err))
			for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
				out = append(out, e.Error())
			}
		}
		if res != nil {
			b, _ := json.Marshal(res)
			out = append(out, string(b))
		}
	}

	// Every fault of the scripted server, with the key required.
	faults := []policytest.Fault{
		policytest.NoFault, policytest.FaultHang, policytest.FaultServerError, policytest.FaultRateLimit,
		policytest.FaultRefuseField, policytest.FaultIgnoreField, policytest.FaultFlatError,
		policytest.FaultUnauthorizedString, policytest.FaultMalformedJSON, policytest.FaultTruncatedBody,
		policytest.FaultSlowFirstByte, policytest.FaultNoLogprobs, policytest.FaultLogprobsMismatch,
	}
	for _, f := range faults {
		synctest.Test(t, func(t *testing.T) {
			srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, APIKey: key, Faults: policytest.FaultAlways(f)})
			defer srv.Close()
			c := newClient(t, srv, policy.Config{APIKey: key, Retries: 1, StepTimeout: 2 * time.Second, Logger: logger})
			record(c.Complete(t.Context(), prompt()))
		})
	}

	// A server that echoes the key in its error messages.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		status := http.StatusUnauthorized
		if r.Header.Get("X-Test-Status") != "" {
			status = http.StatusBadRequest
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"object": "error", "message": "key %s is not valid", "param": "%s"}`, got, got)
	}))
	defer echo.Close()
	defer echo.Client().CloseIdleConnections()
	c, err := policy.New(policy.Config{BaseURL: echo.URL + "/v1", Model: "m", APIKey: key, Logger: logger, HTTPClient: echo.Client()})
	if err != nil {
		t.Fatal(err)
	}
	record(c.Complete(t.Context(), prompt()))
	cfg := c.Config()
	logger.Info("config", "policy", cfg)
	out = append(out, fmt.Sprintf("%v|%+v|%#v|%s", cfg, cfg, cfg, cfg), cfg.String())

	all := strings.Join(out, "\n") + "\n" + logs.String()
	for _, line := range strings.Split(all, "\n") {
		if strings.Contains(line, key) {
			t.Errorf("the API key leaked: %s", line)
		}
	}
	if !strings.Contains(all, "key [redacted] is not valid") {
		t.Errorf("the echoed message should be kept with the key redacted:\n%s", all)
	}
	if !strings.Contains(logs.String(), "retrying") || !strings.Contains(logs.String(), "refused a token-id field") {
		t.Errorf("the log should show retries and the refused field:\n%s", logs.String())
	}
}

// TestShortKeyKeepsMessages: a short key ("k", or vLLM's dummy "EMPTY") is
// redacted where a server echoes it, not in every word that holds it.
func TestShortKeyKeepsMessages(t *testing.T) {
	tests := []struct{ key, want string }{
		{"k", "key [redacted] is not valid: check your key; EMPTY_PROMPT"},
		{"EMPTY", "key [redacted] is not valid: check your key; EMPTY_PROMPT"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"object": "error", "message": "key %s is not valid: check your key; EMPTY_PROMPT"}`, got)
			}))
			defer echo.Close()
			defer echo.Client().CloseIdleConnections()
			c, err := policy.New(policy.Config{BaseURL: echo.URL + "/v1", Model: "m", APIKey: tt.key, HTTPClient: echo.Client()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Complete(t.Context(), prompt())
			var pe *policy.Error
			if !errors.As(err, &pe) {
				t.Fatalf("Complete: %v, want a *policy.Error", err)
			}
			if pe.Message != tt.want {
				t.Errorf("message %q, want %q", pe.Message, tt.want)
			}
		})
	}
}

// TestStringTokenIDs: an answer with token ids as strings fails with a
// *StringIDsError naming the field, as a malformed response, once: the
// server answers every call so.
func TestStringTokenIDs(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices": [{"message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop",
			"logprobs": {"content": [{"token": "Hi", "logprob": -0.1}]}, "token_ids": ["token_id:9707"]}]}`)
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	c, err := policy.New(policy.Config{BaseURL: srv.URL + "/v1", Model: "m", Retries: 2, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Complete(t.Context(), prompt())
	var sid *policy.StringIDsError
	if !errors.As(err, &sid) || !errors.Is(err, policy.ErrBadResponse) {
		t.Fatalf("Complete: %v, want a malformed response with a *policy.StringIDsError", err)
	}
	if want := (policy.StringIDsError{Field: "choices[0].token_ids", Value: `"token_id:9707"`}); *sid != want {
		t.Errorf("%+v, want %+v", *sid, want)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d calls, want 1: the answer will not change", n)
	}
}

func TestMessages(t *testing.T) {
	text := func(s ...string) []schema.Part {
		var ps []schema.Part
		for _, x := range s {
			ps = append(ps, schema.TextPart(x))
		}
		return ps
	}
	t.Run("sent as given", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			msgs := []schema.Message{
				{Role: "system", Content: text("You operate a desktop.", "Use the computer_use tool.")},
				{Role: "user", Content: []schema.Part{schema.TextPart("Open the terminal"), schema.ImagePart("data:image/png;base64,AAA")}},
				{Role: "assistant", Content: text("Action: click.")},
				{Role: "user", Content: []schema.Part{schema.ImagePart("data:image/png;base64,BBB")}},
				{Role: "assistant", Content: text("Action: ", "type.")},
				{Role: "user", Content: text("Go on.")},
			}
			srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, KeepRequests: true})
			defer srv.Close()
			if _, err := newClient(t, srv, policy.Config{}).Complete(t.Context(), msgs); err != nil {
				t.Fatal(err)
			}
			got := srv.Requests()[0]
			if diff := cmp.Diff(msgs, got.Messages); diff != "" {
				t.Errorf("messages the server parsed (-want +got):\n%s", diff)
			}
			if got.Step != 2 || got.Images != 2 {
				t.Errorf("server saw step %d with %d images, want step 2 with 2", got.Step, got.Images)
			}
		})
	})
	bad := []struct {
		name string
		msgs []schema.Message
		want string
	}{
		{"empty", nil, "no messages"},
		{"unknown role", []schema.Message{{Role: "robot", Content: text("hi")}}, `unknown role "robot"`},
		{"image in system", []schema.Message{{Role: "system", Content: []schema.Part{schema.ImagePart("data:image/png;base64,AAA")}}}, "only user messages may hold images"},
		{"image reference", []schema.Message{{Role: "user", Content: []schema.Part{schema.ImagePart(schema.ImageScheme + "abc")}}}, "load it from the run's image store"},
		{"unknown part", []schema.Message{{Role: "user", Content: []schema.Part{{Type: "audio"}}}}, `unknown part type "audio"`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			c, err := policy.New(policy.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Complete(t.Context(), tt.msgs)
			if !errors.Is(err, policy.ErrInvalidMessages) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrInvalidMessages saying %q", err, tt.want)
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/v1"
	ln.Close() // nothing listens there now
	c, err := policy.New(policy.Config{BaseURL: url, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Complete(t.Context(), prompt())
	var pe *policy.Error
	var op *net.OpError
	if !errors.Is(err, policy.ErrConnection) || !errors.As(err, &pe) || !errors.As(err, &op) {
		t.Fatalf("err = %v, want ErrConnection wrapping a *net.OpError", err)
	}
	if pe.Permanent || pe.Attempts != 1 || res.Model.Attempts != 1 {
		t.Errorf("error %+v, result %+v: want 1 attempt, not permanent", pe, res.Model)
	}
}

func TestRealServer(t *testing.T) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Dialect: policytest.SGLang, APIKey: "k"})
	defer srv.Close()
	c, err := policy.New(policy.Config{BaseURL: srv.URL(), Model: "qwen", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Complete(t.Context(), prompt())
	if err != nil {
		t.Fatal(err)
	}
	reply := policytest.DefaultScript(policytest.Request{Instruction: instruction})
	if diff := cmp.Diff(wantResponse(reply, schema.SourceReturnTokenIDs), res.Response); diff != "" {
		t.Errorf("response over TCP (-want +got):\n%s", diff)
	}
}

// TestValidationErrorKeepsTokenIDs: vLLM's and SGLang's validation 400
// echoes the whole request body, return_token_ids included. That is not
// the server refusing the field: the client keeps asking for ids, and the
// error it returns carries a capped message, not the body.
func TestValidationErrorKeepsTokenIDs(t *testing.T) {
	for _, d := range []policytest.Dialect{policytest.VLLM, policytest.SGLang} {
		t.Run(string(d), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := policytest.NewPipeServer(policytest.Options{Dialect: d, NoLatency: true, KeepRequests: true,
					Faults: policytest.FaultSeq(policytest.FaultValidationError)})
				defer srv.Close()
				c := newClient(t, srv, policy.Config{})
				// A screenshot of 100 KB, which the echo repeats.
				big := prompt()
				big[1].Content[1] = schema.ImagePart("data:image/png;base64," + strings.Repeat("A", 100<<10))
				_, err := c.Complete(t.Context(), big)
				var pe *policy.Error
				if !errors.As(err, &pe) || !errors.Is(err, policy.ErrBadRequest) || pe.Attempts != 1 {
					t.Fatalf("first call: %v, want one 400 attempt", err)
				}
				if !strings.Contains(pe.Message, "validation error") || len(pe.Message) > 1100 || !strings.Contains(pe.Message, "more bytes)") {
					t.Errorf("error message of %d bytes, want the start of the validation error, capped and saying so: %.200q", len(pe.Message), pe.Message)
				}
				if got := c.RefusedFields(); len(got) != 0 {
					t.Errorf("RefusedFields() = %q after an echo of the body, want none", got)
				}
				res, err := c.Complete(t.Context(), prompt())
				if err != nil {
					t.Fatal(err)
				}
				if res.Response.TokenIDsSource != schema.SourceReturnTokenIDs || res.Model.Attempts != 1 {
					t.Errorf("second call: ids from %q in %d attempts, want return_token_ids in 1", res.Response.TokenIDsSource, res.Model.Attempts)
				}
				for i, r := range srv.Requests() {
					if !r.ReturnTokenIDs {
						t.Errorf("request %d did not ask for return_token_ids", i)
					}
				}
			})
		})
	}
}

// TestRefusedReturnTokenIDs: a server that refuses return_token_ids with a
// 400 naming it, but knows an older form, still gives exact ids.
func TestRefusedReturnTokenIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Faults: policytest.FaultAlways(policytest.FaultRefuseField)})
		defer srv.Close()
		c := newClient(t, srv, policy.Config{})
		for i := range 2 {
			res, err := c.Complete(t.Context(), prompt())
			if err != nil {
				t.Fatal(err)
			}
			if wantAttempts := []int{2, 1}[i]; res.Response.TokenIDsSource != schema.SourceTokensAsIDs || res.Model.Attempts != wantAttempts {
				t.Errorf("call %d: ids from %q in %d attempts, want tokens_as_ids in %d", i, res.Response.TokenIDsSource, res.Model.Attempts, wantAttempts)
			}
		}
		if diff := cmp.Diff([]string{"return_token_ids"}, c.RefusedFields()); diff != "" {
			t.Errorf("RefusedFields() (-want +got):\n%s", diff)
		}
	})
}

// TestCachedTokensLearned: vLLM before mid-2026 sends null details when
// nothing was cached. Before any count the client cannot tell that from
// reporting being off; once a count came, null means 0.
func TestCachedTokensLearned(t *testing.T) {
	other := func() []schema.Message {
		p := prompt()
		p[0].Content[0] = schema.TextPart("A different system prompt, so that nothing of it is cached at all.")
		return p
	}
	tests := []struct {
		name string
		opts policytest.Options
		want []string // per call: "nil" or the count's sign
	}{
		{"vllm 0.10.2", policytest.Options{Version: policytest.VLLM0102}, []string{"nil", ">0", "0"}},
		{"vllm 0.10.2 reporting off", policytest.Options{Version: policytest.VLLM0102, NoCacheReport: true}, []string{"nil", "nil", "nil"}},
		{"vllm latest", policytest.Options{}, []string{"0", ">0", "0"}},
		{"sglang latest reporting off", policytest.Options{Dialect: policytest.SGLang, NoCacheReport: true}, []string{"nil", "nil", "nil"}},
		{"sglang latest", policytest.Options{Dialect: policytest.SGLang}, []string{"nil", ">0", "0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				srv := policytest.NewPipeServer(tt.opts)
				defer srv.Close()
				c := newClient(t, srv, policy.Config{})
				var got []string
				for _, p := range [][]schema.Message{prompt(), prompt(), other()} {
					res, err := c.Complete(t.Context(), p)
					if err != nil {
						t.Fatal(err)
					}
					switch n := res.Model.CachedTokens; {
					case n == nil:
						got = append(got, "nil")
					case *n == 0:
						got = append(got, "0")
					default:
						got = append(got, ">0")
					}
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("cached tokens per call (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestSamplingKnobs: the knobs reach the server as set, 0 temperature
// included, and the record's policy block says what was sent.
func TestSamplingKnobs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, KeepRequests: true})
		defer srv.Close()
		cfg := policy.Config{Version: "v3", Temperature: new(0.0), TopP: new(0.95), MaxTokens: 512}
		c := newClient(t, srv, cfg)
		if _, err := c.Complete(t.Context(), prompt()); err != nil {
			t.Fatal(err)
		}
		r := srv.Requests()[0]
		if r.Temperature == nil || *r.Temperature != 0 || r.TopP == nil || *r.TopP != 0.95 || r.MaxTokens != 512 {
			t.Errorf("server saw temperature %v, top_p %v, max_tokens %d; want 0, 0.95, 512", r.Temperature, r.TopP, r.MaxTokens)
		}
		want := schema.Policy{Model: "qwen", Version: "v3", Temperature: new(0.0), TopP: new(0.95), MaxTokens: 512}
		if diff := cmp.Diff(want, c.Config().Policy()); diff != "" {
			t.Errorf("Policy() (-want +got):\n%s", diff)
		}
		// Unset knobs are left to the server and out of the record.
		if _, err := newClient(t, srv, policy.Config{}).Complete(t.Context(), prompt()); err != nil {
			t.Fatal(err)
		}
		if r := srv.Requests()[1]; slices.ContainsFunc(r.Fields, func(f string) bool { return f == "temperature" || f == "top_p" || f == "max_tokens" }) {
			t.Errorf("unset knobs were sent: %q", r.Fields)
		}
		if p := (policy.Config{Model: "m"}).Policy(); p.Temperature != nil || p.TopP != nil || p.MaxTokens != 0 {
			t.Errorf("Policy() of unset knobs = %+v, want none", p)
		}
	})
}

// TestTokenIDsFoundConcurrently: the first calls of a batch arrive
// together; each asks again at most once, and every one comes back with
// exact ids.
func TestTokenIDsFoundConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := policytest.NewPipeServer(policytest.Options{Version: policytest.VLLM0101, NoLatency: true})
		defer srv.Close()
		c := newClient(t, srv, policy.Config{})
		const calls = 16
		var wg sync.WaitGroup
		results := make([]*policy.Result, calls)
		for i := range calls {
			wg.Go(func() {
				res, err := c.Complete(t.Context(), prompt())
				if err != nil {
					t.Error(err)
				}
				results[i] = res
			})
		}
		wg.Wait()
		for i, res := range results {
			if res == nil {
				continue
			}
			if res.Response.TokenIDsSource != schema.SourceTokensAsIDs || res.Model.Attempts > 2 {
				t.Errorf("call %d: ids from %q in %d attempts, want tokens_as_ids in at most 2", i, res.Response.TokenIDsSource, res.Model.Attempts)
			}
		}
		if n := srv.Stats().Requests; n > 2*calls {
			t.Errorf("%d requests for %d calls", n, calls)
		}
		if got := c.TokenIDSource(); got != schema.SourceTokensAsIDs {
			t.Errorf("TokenIDSource() = %q, want tokens_as_ids", got)
		}
	})
}

// TestAbortedIsNeverAReply: an aborted generation is an outage (sent again
// once the server serves), a ping that is aborted fails, and the fragment
// is never returned as a reply.
func TestAbortedIsNeverAReply(t *testing.T) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Faults: policytest.FaultAlways(policytest.FaultAbort)})
	defer srv.Close()
	c := newClient(t, srv, policy.Config{StepTimeout: 10 * time.Second, Retries: 0})
	res, err := c.Complete(t.Context(), prompt())
	if !errors.Is(err, policy.ErrAborted) || !policy.IsOutage(err) {
		t.Fatalf("err = %v, want ErrAborted, an outage", err)
	}
	if res != nil && res.Response.Content != "" {
		t.Errorf("the aborted fragment came back as a reply: %q", res.Response.Content)
	}
	if err := c.Ping(t.Context()); !errors.Is(err, policy.ErrAborted) {
		t.Errorf("ping of an aborting server: %v, want ErrAborted", err)
	}
}

// TestWeightVersion: SGLang's weight_version is the result's, except its
// placeholder "default", which names no weights.
func TestWeightVersion(t *testing.T) {
	var version atomic.Value
	version.Store("")
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Dialect: policytest.SGLang,
		WeightVersion: func() string { return version.Load().(string) }})
	defer srv.Close()
	c := newClient(t, srv, policy.Config{StepTimeout: 10 * time.Second})
	for _, tt := range []struct{ server, want string }{{"", ""}, {"step-42", "step-42"}, {"default", ""}} {
		version.Store(tt.server)
		res, err := c.Complete(t.Context(), prompt())
		if err != nil {
			t.Fatal(err)
		}
		if res.WeightVersion != tt.want {
			t.Errorf("server version %q: WeightVersion %q, want %q", tt.server, res.WeightVersion, tt.want)
		}
	}
}
