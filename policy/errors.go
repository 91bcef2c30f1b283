package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors, one per way a call can fail. A *Error wraps exactly one
// of them, or the caller's ctx error when the caller gave up.
var (
	// ErrTimeout: an attempt got no complete answer within StepTimeout.
	ErrTimeout = errors.New("policy server timed out")
	// ErrConnection: the server could not be reached, or dropped the
	// connection before the answer was complete.
	ErrConnection = errors.New("policy server connection failed")
	// ErrRateLimited: the server answered 429.
	ErrRateLimited = errors.New("policy server rate limited the call")
	// ErrServer: the server answered 5xx.
	ErrServer = errors.New("policy server failed")
	// ErrBadResponse: the server answered 200 with a body that is not a
	// chat completion.
	ErrBadResponse = errors.New("policy server sent a malformed response")
	// ErrUnauthorized: the server answered 401 or 403.
	ErrUnauthorized = errors.New("policy server rejected the API key")
	// ErrNotFound: the server answered 404 (unknown model or wrong URL).
	ErrNotFound = errors.New("model or endpoint not found")
	// ErrBadRequest: the server answered another 4xx.
	ErrBadRequest = errors.New("policy server rejected the request")
	// ErrAborted: the server answered with a generation it aborted
	// (finish_reason "abort"), as vLLM and SGLang do while a trainer
	// pauses them to swap weights. The fragment is dropped; the call is
	// sent again once the server serves (IsOutage).
	ErrAborted = errors.New("policy server aborted the generation")
	// ErrInvalidMessages: the prompt cannot be sent as it is (unknown role,
	// an image in a system message, an image not loaded as a data URL).
	ErrInvalidMessages = errors.New("invalid prompt messages")
)

// Error is a failed model call.
type Error struct {
	// URL is the chat-completions endpoint, without credentials.
	URL   string
	Model string
	// Status is the HTTP status of the last answer; 0 when there was none
	// (timeout, connection error, cancellation).
	Status int
	// Message is the server's error message, or what went wrong. It never
	// holds the API key.
	Message string
	// Attempts is the number of HTTP requests made.
	Attempts int
	// Permanent reports that sending the same request again cannot
	// succeed (400, 401, 403, 404, …), so it was not retried.
	Permanent bool
	// Err is the sentinel of the failure (ErrTimeout, ErrServer, …) or,
	// when the caller's ctx ended the call, its error (context.Canceled,
	// context.DeadlineExceeded).
	Err error

	// cause is the transport error behind ErrConnection, or the
	// *StringIDsError behind ErrBadResponse, kept for errors.As; its text
	// is not part of Error().
	cause error
	// param is the request field a 400 names; retryAfter what a 429 asked;
	// full the server's message before Message was capped.
	param      string
	retryAfter time.Duration
	full       string
}

// maxMessage caps Error.Message: a validation error of vLLM or SGLang
// echoes the whole request body, screenshots included, and the message
// ends up in a record.
const maxMessage = 1024

// capMessage cuts s to maxMessage bytes, on a character boundary, and says
// how much it cut.
func capMessage(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:cut], len(s)-cut)
}

// refusedFields returns the token-id fields of sent that a 400 refuses:
// those its param names, or its message names as the problem. A message
// that only echoes the request body (vLLM's and SGLang's validation
// errors hold the whole body, so every field the request sent) names
// nothing: a field followed by a colon is a key of the echo.
func refusedFields(e *Error, sent idFields) idFields {
	if e.Status != http.StatusBadRequest {
		return 0
	}
	var f idFields
	for _, n := range idFieldNames {
		if sent&n.f != 0 && (e.param == n.name || namesField(e.full, n.name)) {
			f |= n.f
		}
	}
	return f
}

// namesField reports whether msg mentions field other than as a key: as
// in "Unrecognized request argument supplied: return_token_ids" or
// "'loc': ('body', 'return_token_ids')", not "'return_token_ids': True".
func namesField(msg, field string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], field)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(field)
		i = end
		if start > 0 && isNameByte(msg[start-1]) || end < len(msg) && isNameByte(msg[end]) {
			continue // part of a longer name
		}
		k := end
		if k < len(msg) && (msg[k] == '\'' || msg[k] == '"') {
			k++
		}
		for k < len(msg) && msg[k] == ' ' {
			k++
		}
		if k < len(msg) && msg[k] == ':' {
			continue // a key of an echoed body
		}
		return true
	}
}

func isNameByte(b byte) bool {
	return b == '_' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy call to %s (model %q)", e.URL, e.Model)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": %d %s", e.Status, http.StatusText(e.Status))
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	} else if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		b.WriteString(" (check the API key)")
	case http.StatusNotFound:
		b.WriteString(" (check the model name, and that the base URL ends in /v1)")
	}
	if e.Attempts == 1 {
		b.WriteString("; 1 attempt")
	} else {
		fmt.Fprintf(&b, "; %d attempts", e.Attempts)
	}
	return b.String()
}

// Unwrap returns the sentinel (or ctx error) and the transport error behind
// a connection failure.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.Err, e.cause}
	}
	return []error{e.Err}
}

// statusError is an HTTP error answer, caught by the client's middleware
// before openai-go parses it (openai-go keeps only nested error bodies).
type statusError struct {
	status     int
	message    string
	param      string
	retryAfter time.Duration // 0 when the server did not say
}

func (e *statusError) Error() string { return fmt.Sprintf("%d %s", e.status, e.message) }

// errorMessage extracts the message of an error body in any of the shapes
// servers use: nested {"error": {"message": …, "param": …}} (OpenAI, vLLM),
// flat {"object": "error", "message": …} (SGLang, old vLLM), a plain
// {"error": "Unauthorized"} (vLLM's key check), or a body that is not JSON.
func errorMessage(body []byte) (message, param string) {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
		Param   any             `json:"param"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		if msg, ok := cutMessage(body); ok {
			return msg, ""
		}
		s := strings.TrimSpace(string(body))
		if len(s) > 300 {
			s = s[:300] + "…"
		}
		return s, ""
	}
	var nested struct {
		Message string `json:"message"`
		Param   any    `json:"param"`
	}
	var str string
	switch {
	case len(v.Error) > 0 && json.Unmarshal(v.Error, &nested) == nil && nested.Message != "":
		return nested.Message, paramString(nested.Param)
	case len(v.Error) > 0 && json.Unmarshal(v.Error, &str) == nil && str != "":
		return str, ""
	case v.Message != "":
		return v.Message, paramString(v.Param)
	case len(v.Detail) > 0:
		// FastAPI's validation errors.
		return string(v.Detail), ""
	}
	return strings.TrimSpace(string(body)), ""
}

// cutMessage reads the "message" of an error body cut short (the client
// reads 64 KiB of it; a validation error echoing 20 screenshots is much
// longer): the string as far as it goes, and "…".
func cutMessage(body []byte) (string, bool) {
	_, rest, ok := bytes.Cut(body, []byte(`"message"`))
	if !ok {
		return "", false
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if rest, ok = bytes.CutPrefix(rest, []byte(":")); !ok {
		return "", false
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if rest, ok = bytes.CutPrefix(rest, []byte(`"`)); !ok {
		return "", false
	}
	// Up to the closing quote, or the end less an escape cut in half.
	end := len(rest)
	for i := 0; i < len(rest); i++ {
		if rest[i] == '\\' {
			if i+1 >= len(rest) || (rest[i+1] == 'u' && i+6 > len(rest)) {
				end = i
				break
			}
			i++
			continue
		}
		if rest[i] == '"' {
			end = i
			break
		}
	}
	var msg string
	if err := json.Unmarshal(append(append([]byte(`"`), rest[:end]...), '"'), &msg); err != nil {
		return "", false
	}
	if end == len(rest) || rest[end] != '"' {
		msg += "…"
	}
	return msg, true
}

func paramString(p any) string {
	if s, ok := p.(string); ok {
		return s
	}
	return ""
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date.
func parseRetryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(h, 64); err == nil && secs > 0 {
		return time.Duration(secs * float64(time.Second))
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
