package probe

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"legato/rl/policy"
)

// TestRunStringTokenIDs: a server whose answers carry token ids as strings
// generated fine; the verdict says where the strings were and what legato
// reads, and does not send the user to the engine's logs (CUDA).
func TestRunStringTokenIDs(t *testing.T) {
	const logprobs = `"logprobs": {"content": [{"token": "Hi", "logprob": -0.1}, {"token": "!", "logprob": -0.2}]}`
	tests := []struct {
		name string
		// choice is the fields of choices[0] besides message, logprobs
		// and finish_reason; top those of the answer besides choices.
		choice, top string
		wantField   string
		wantValue   string
	}{
		{"token ids as numbers in strings", `"token_ids": ["123", "456"]`, ``,
			"choices[0].token_ids", `"123"`},
		{"token ids as logprob placeholders", `"token_ids": ["token_id:123", "token_id:456"]`, ``,
			"choices[0].token_ids", `"token_id:123"`},
		{"token ids as one string", `"token_ids": "123 456"`, ``,
			"choices[0].token_ids", `"123 456"`},
		{"vLLM prompt token ids", `"token_ids": [123, 456]`, `"prompt_token_ids": [1, "2"],`,
			"prompt_token_ids", `"2"`},
		{"SGLang prompt token ids", `"token_ids": [123, 456], "prompt_token_ids": ["1", "2"]`, ``,
			"choices[0].prompt_token_ids", `"1"`},
		{"SGLang meta_info", `"meta_info": {"output_token_logprobs": [[-0.1, "123", null], [-0.2, "456", null]]}`, ``,
			"choices[0].meta_info.output_token_logprobs[0][1]", `"123"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if r.URL.Path == "/v1/models" {
					fmt.Fprint(w, `{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}`)
					return
				}
				fmt.Fprintf(w, `{"id": "c", "object": "chat.completion", "model": "m", %s
					"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, %s, "finish_reason": "stop", %s}],
					"usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}`, tt.top, logprobs, tt.choice)
			}))
			defer srv.Close()
			defer srv.Client().CloseIdleConnections()
			r, err := Run(t.Context(), policy.Config{BaseURL: srv.URL + "/v1", Model: "m", StepTimeout: 10 * time.Second, HTTPClient: srv.Client()}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Server != "vllm" {
				t.Fatalf("server %q, want vllm: the test tested nothing", r.Server)
			}
			wantWhy := "token ids as strings in " + tt.wantField
			if r.Trainable || len(r.Why) != 1 || r.Why[0] != wantWhy {
				t.Errorf("trainable %v, why %q; want not trainable: %s", r.Trainable, r.Why, wantWhy)
			}
			if len(r.Advice) != 1 || !strings.Contains(r.Advice[0], "the server sends "+tt.wantField+" as strings ("+tt.wantValue+") where legato reads token ids as JSON integers") {
				t.Errorf("advice %q; want one item saying %s holds strings (%s)", r.Advice, tt.wantField, tt.wantValue)
			}
			var out bytes.Buffer
			if err := r.WriteTable(&out); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), "CUDA") || strings.Contains(out.String(), "server's logs") {
				t.Errorf("the report blames the engine:\n%s", out.String())
			}
			if !strings.Contains(out.String(), "answered, with token ids as strings") || !strings.Contains(out.String(), tt.wantField) {
				t.Errorf("the report does not name %s:\n%s", tt.wantField, out.String())
			}
		})
	}
}
