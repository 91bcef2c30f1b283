package policy

import "testing"

func TestRedactKey(t *testing.T) {
	const real = "sk-proj-4f9a1c2e7b3d5a6f8e0c" // 28 characters: a secret
	tests := []struct {
		name, key, in, want string
	}{
		{"no key", "", "key k is not valid", "key k is not valid"},
		{"dummy key echoed", "EMPTY", "Invalid API key: EMPTY", "Invalid API key: [redacted]"},
		{"dummy key in a bearer header", "EMPTY", "Authorization: Bearer EMPTY\nHost: x", "Authorization: Bearer [redacted]\nHost: x"},
		{"dummy key inside words", "EMPTY", "EMPTY_PROMPT: the prompt is NONEMPTY or EMPTY-ish", "EMPTY_PROMPT: the prompt is NONEMPTY or EMPTY-ish"},
		{"one-letter key", "k", "key k is not valid (kind: token)", "key [redacted] is not valid (kind: token)"},
		{"one-letter key quoted and in a query", "k", `{"api_key": "k"} ?api_key=k&model=m k.`, `{"api_key": "[redacted]"} ?api_key=[redacted]&model=m [redacted].`},
		{"one-letter key next to non-ASCII letters", "k", "kö ök k", "kö ök [redacted]"},
		{"short key at both ends", "abc", "abc is abc", "[redacted] is [redacted]"},
		{"short key overlapping a longer word", "a.a", "xa.a.a", "xa.[redacted]"},
		{"short key nowhere", "k", "model not found", "model not found"},
		{"real key in a message", real, "key " + real + " is not valid", "key [redacted] is not valid"},
		{"real key glued to a word", real, "Bearer" + real + "x and " + real, "Bearer[redacted]x and [redacted]"},
		{"real key in a URL", real, "GET http://h/v1?key=" + real + "&a=1", "GET http://h/v1?key=[redacted]&a=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redactKey(tt.in, tt.key); got != tt.want {
				t.Errorf("redactKey(%q, %q)\n got %q\nwant %q", tt.in, tt.key, got, tt.want)
			}
		})
	}
}
