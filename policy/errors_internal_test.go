package policy

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// TestRefusedFields: a field is refused when the 400 names it as the
// problem, never because the message echoes the request body.
func TestRefusedFields(t *testing.T) {
	all := fieldReturnTokenIDs | fieldTokensAsIDs | fieldMetaInfo | fieldPromptTokenIDs
	tests := []struct {
		name   string
		status int
		param  string
		msg    string
		sent   idFields
		want   idFields
	}{
		{"param", 400, "return_token_ids", "bad request", all, fieldReturnTokenIDs},
		{"param of a field not sent", 400, "return_token_ids", "bad request", fieldMetaInfo, 0},
		{"OpenAI lists the fields", 400, "", "Unrecognized request argument supplied: return_meta_info, return_prompt_token_ids, return_tokens_as_token_ids",
			all, fieldTokensAsIDs | fieldMetaInfo | fieldPromptTokenIDs},
		{"pydantic extra_forbidden names it in loc", 400, "",
			"[{'type': 'extra_forbidden', 'loc': ('body', 'return_token_ids'), 'msg': 'Extra inputs are not permitted', 'input': True}]",
			all, fieldReturnTokenIDs},
		{"python echo of the body", 400, "",
			"1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, `top_logprobs` must be a positive value.', 'input': {'logprobs': True, 'model': 'm', 'return_token_ids': True}}",
			all, 0},
		{"JSON echo of the body", 400, "", `invalid request {"model":"m","return_token_ids":true,"return_meta_info" : true}`, all, 0},
		{"echo and a real complaint", 400, "",
			"{'input': {'return_token_ids': True, 'return_meta_info': True}} and unknown field return_meta_info",
			all, fieldMetaInfo},
		{"a longer name is not the field", 400, "", "unknown field x_return_token_ids_y", all, 0},
		{"not a 400", 500, "return_token_ids", "unsupported field(s): return_token_ids", all, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Error{Status: tt.status, param: tt.param, full: tt.msg}
			if got := refusedFields(e, tt.sent); got != tt.want {
				t.Errorf("refusedFields = %q, want %q", got.names(), tt.want.names())
			}
		})
	}
}

func TestCapMessage(t *testing.T) {
	short := strings.Repeat("é", 10)
	if got := capMessage(short); got != short {
		t.Errorf("capMessage(%q) = %q, want it unchanged", short, got)
	}
	long := strings.Repeat("é", maxMessage) // 2 bytes each
	got := capMessage(long)
	head, tail, ok := strings.Cut(got, "…")
	if !ok || len(head) > maxMessage || !utf8.ValidString(head) || tail != fmt.Sprintf(" (%d more bytes)", len(long)-len(head)) {
		t.Errorf("capMessage of %d bytes = %d bytes ending %q", len(long), len(got), got[max(0, len(got)-40):])
	}
}

// TestCutMessage: the message of an error body cut short is read as far as
// it goes.
func TestCutMessage(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"cut in the message", `{"error":{"message":"1 validation error:\n  {'input': {'messages': [{'content': 'AAAA`, "1 validation error:\n  {'input': {'messages': [{'content': 'AAAA…"},
		{"cut in an escape", `{"object":"error","message":"a\u00`, "a…"},
		{"cut after the message", `{"error":{"message":"too many images","type":"Bad`, "too many images"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, _ := errorMessage([]byte(tt.body))
			if msg != tt.want {
				t.Errorf("errorMessage = %q, want %q", msg, tt.want)
			}
		})
	}
}

// FuzzErrorBody feeds server error bodies, whole or cut short, through what
// the client reads of them: no panic, a message no longer than the body's
// text allows, and a refusal only of fields the request sent.
func FuzzErrorBody(f *testing.F) {
	f.Add([]byte(`{"error":{"message":"Unrecognized request argument supplied: return_token_ids","param":"return_token_ids"}}`), 5)
	f.Add([]byte(`{"object":"error","message":"1 validation error: {'input': {'return_token_ids': True}}"`), 1)
	f.Add([]byte(`{"message": "a\u00`), 15)
	f.Fuzz(func(t *testing.T, body []byte, sent int) {
		msg, param := errorMessage(body)
		e := &Error{Status: 400, param: param, full: msg, Message: capMessage(msg)}
		if len(e.Message) > maxMessage+len("… (more bytes)")+20 {
			t.Fatalf("capped message of %d bytes", len(e.Message))
		}
		s := idFields(sent) & (fieldReturnTokenIDs | fieldTokensAsIDs | fieldMetaInfo | fieldPromptTokenIDs)
		if got := refusedFields(e, s); got&^s != 0 {
			t.Fatalf("refused %q, not all of them sent (%q)", got.names(), s.names())
		}
	})
}

// FuzzFill feeds chat-completion answers through what the client keeps of
// them: no panic, and exact ids only with a source that says so.
func FuzzFill(f *testing.F) {
	f.Add([]byte(`{"choices":[{"message":{"content":"hi"},"logprobs":{"content":[{"token":"token_id:12","logprob":-1}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":null}}`), 1)
	f.Add([]byte(`{"choices":[{"message":{"content":"hi"},"meta_info":{"output_token_logprobs":[[-0.5,151645,"<|im_end|>"]]},"prompt_token_ids":[1,2]}],"usage":{"prompt_tokens_details":{"cached_tokens":0,"image_tokens":32}}}`), 1)
	f.Add([]byte(`{"choices":[{"token_ids":[1,2,3]}],"prompt_token_ids":[4]}`), 0)
	f.Fuzz(func(t *testing.T, raw []byte, mode int) {
		c := &Client{log: slog.New(slog.DiscardHandler)}
		m := idMode(uint(mode) % uint(modeStrings+1))
		res := &Result{}
		if _, err := c.fill(res, raw, m, m.fields()); err != nil {
			return
		}
		r := res.Response
		if !r.TokenIDsSource.Exact() && r.TokenIDs != nil {
			t.Fatalf("ids %v from source %q", r.TokenIDs, r.TokenIDsSource)
		}
		if r.TokenIDsSource.Exact() && r.Tokens != nil {
			t.Fatalf("token strings kept beside exact ids from %q", r.TokenIDsSource)
		}
	})
}
