package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		name, body, wantMsg, wantParam string
	}{
		{"nested (OpenAI, vLLM)", `{"error": {"message": "Unrecognized request argument supplied: return_token_ids", "type": "invalid_request_error", "param": "return_token_ids", "code": null}}`,
			"Unrecognized request argument supplied: return_token_ids", "return_token_ids"},
		{"flat (SGLang, old vLLM)", `{"object": "error", "message": "The model does not exist.", "type": "NotFoundError", "param": null, "code": 404}`,
			"The model does not exist.", ""},
		{"plain string (vLLM --api-key)", `{"error": "Unauthorized"}`, "Unauthorized", ""},
		{"FastAPI detail", `{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}`,
			`[{"loc": ["body", "messages"], "msg": "field required"}]`, ""},
		{"not JSON", "<html><body>502 Bad Gateway</body></html>\n", "<html><body>502 Bad Gateway</body></html>", ""},
		{"empty", "", "", ""},
		{"unknown JSON", `{"status": "down"}`, `{"status": "down"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, param := errorMessage([]byte(tt.body))
			if diff := cmp.Diff([2]string{tt.wantMsg, tt.wantParam}, [2]string{msg, param}); diff != "" {
				t.Errorf("errorMessage (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{"0.5", 500 * time.Millisecond},
		{"-1", 0},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0},
		{"soon", 0},
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.header, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}
