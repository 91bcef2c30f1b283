package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"legato/rl/schema"
)

// Defaults for Config.
const (
	// DefaultStepTimeout bounds one attempt of a model call.
	DefaultStepTimeout = 60 * time.Second
	// DefaultRetries is the number of extra tries the CLI allows after a
	// retryable failure.
	DefaultRetries = 1
	// DefaultMaxInflight means no cap on concurrent model calls.
	DefaultMaxInflight = 0
)

// KeyEnv is the environment variable that holds the model server's key,
// read by the command line (and the scripted server's -require-key). The
// key is never a flag, so it stays out of argv and shell history.
const KeyEnv = "LEGATO_POLICY_KEY"

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("invalid policy config")

// Config says which server and model to call and how. The zero value of
// each optional field is documented; Validate reports what is missing.
//
// The APIKey is secret: String, GoString and LogValue redact it, and no error
// or log line of this package contains it. Printing a struct that holds a
// Config in an unexported field bypasses String, so don't.
type Config struct {
	// BaseURL is the server's OpenAI API root, e.g.
	// "http://127.0.0.1:8000/v1"; requests go to BaseURL/chat/completions.
	BaseURL string
	// Replicas are the API roots of more servers that serve the same
	// weights (data-parallel replicas). NewReplicas spreads calls over
	// BaseURL and these as Routing says; New uses BaseURL only.
	Replicas []string
	// Routing says how NewReplicas spreads calls (default RouteSticky).
	Routing Routing
	// Model is the model name sent with every request.
	Model string
	// Version names the policy weights; it is recorded with the
	// trajectories, not sent.
	Version string
	// APIKey is sent as a bearer token when set. The CLI reads it from
	// the environment variable KeyEnv; it is never a flag.
	APIKey string
	// StepTimeout bounds one attempt of a call; zero means
	// DefaultStepTimeout. A call never runs longer than
	// (Retries+1)·StepTimeout.
	StepTimeout time.Duration
	// Retries is the number of extra tries after a timeout, a connection
	// error, a 429 or a 5xx. Zero means none; the CLI's default is
	// DefaultRetries.
	Retries int
	// MaxInflight caps concurrent calls across every user of the Client;
	// zero means no cap. Time spent waiting for a slot is reported as
	// queue time, not model time.
	MaxInflight int
	// MaxTokens caps generated tokens per call; zero leaves it to the
	// server.
	MaxTokens int
	// Temperature is the sampling temperature; nil leaves it to the server
	// (vLLM and SGLang then use the model's generation config). 0 is
	// greedy decoding.
	Temperature *float64
	// TopP is nucleus sampling's probability mass; nil leaves it to the
	// server, like Temperature.
	TopP *float64
	// Extra holds more top-level request fields, sent as they are (e.g.
	// "top_k", "chat_template_kwargs"). It may not set the fields the
	// client owns: model, messages, logprobs, stream, the token-id fields
	// (return_token_ids, return_tokens_as_token_ids, return_meta_info,
	// return_prompt_token_ids), max_tokens, temperature and top_p (set
	// MaxTokens, Temperature and TopP instead).
	Extra map[string]any
	// Logger receives retries and degradations; nil discards them.
	Logger *slog.Logger
	// HTTPClient sends the requests; nil means a client of the Client's
	// own, with enough idle connections for MaxInflight callers, closed by
	// Client.Close.
	HTTPClient *http.Client
}

// ownedFields are the request fields the client sets itself (max_tokens and
// temperature through their Config fields), so that no body carries a key
// twice.
var ownedFields = []string{"model", "messages", "logprobs", "stream", "return_token_ids", "return_tokens_as_token_ids",
	"return_meta_info", "return_prompt_token_ids", "max_tokens", "temperature", "top_p"}

// Validate reports every problem of c, each naming the field and what to
// do; the errors wrap ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.BaseURL == "" {
		bad("BaseURL is empty: set it to the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
	} else if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("BaseURL %q is not an http(s) URL: set it to the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1", redactURL(c.BaseURL))
	}
	for i, r := range c.Replicas {
		if u, err := url.Parse(r); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("Replicas[%d] %q is not an http(s) URL: give each replica's OpenAI API root, e.g. http://127.0.0.1:8001/v1", i, redactURL(r))
		}
	}
	if c.Routing != RouteSticky && c.Routing != RouteRoundRobin {
		bad("Routing is %d: use RouteSticky or RouteRoundRobin", int(c.Routing))
	}
	if c.Model == "" {
		bad("Model is empty: set it to the name the server serves the policy under")
	}
	if strings.ContainsAny(c.APIKey, "\r\n") {
		bad("APIKey contains a line break: check how it was read")
	}
	if c.StepTimeout < 0 {
		bad("StepTimeout is %v: use a positive duration, or zero for %v", c.StepTimeout, DefaultStepTimeout)
	}
	if c.Retries < 0 {
		bad("Retries is %d: use zero or more", c.Retries)
	}
	if c.MaxInflight < 0 {
		bad("MaxInflight is %d: use zero (no cap) or more", c.MaxInflight)
	}
	if c.MaxTokens < 0 {
		bad("MaxTokens is %d: use zero (server default) or more", c.MaxTokens)
	}
	if t := c.Temperature; t != nil && !(*t >= 0 && *t <= 2) {
		bad("Temperature is %v: use a value in [0, 2], or nil for the server's default", *t)
	}
	if p := c.TopP; p != nil && !(*p > 0 && *p <= 1) {
		bad("TopP is %v: use a value in (0, 1], or nil for the server's default", *p)
	}
	for _, f := range ownedFields {
		if _, ok := c.Extra[f]; ok {
			bad("Extra sets %q, which the client sets itself: remove it (use MaxTokens, Temperature and TopP for those)", f)
		}
	}
	return errors.Join(errs...)
}

// Policy is what a record says of the weights and how they were sampled.
func (c Config) Policy() schema.Policy {
	p := schema.Policy{Model: c.Model, Version: c.Version, MaxTokens: c.MaxTokens}
	if c.Temperature != nil {
		p.Temperature = new(*c.Temperature)
	}
	if c.TopP != nil {
		p.TopP = new(*c.TopP)
	}
	return p
}

// String describes c with the API key redacted.
func (c Config) String() string {
	orDefault := func(v *float64) string {
		if v == nil {
			return "server default"
		}
		return fmt.Sprint(*v)
	}
	return fmt.Sprintf("policy.Config{BaseURL: %q, Model: %q, Version: %q, APIKey: %s, StepTimeout: %v, Retries: %d, MaxInflight: %d, MaxTokens: %d, Temperature: %s, TopP: %s}",
		redactURL(c.BaseURL), c.Model, c.Version, redactedKey(c.APIKey), c.StepTimeout, c.Retries, c.MaxInflight, c.MaxTokens,
		orDefault(c.Temperature), orDefault(c.TopP))
}

// GoString is String, so that %#v does not print the key either.
func (c Config) GoString() string { return c.String() }

// LogValue implements slog.LogValuer with the API key redacted.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("base_url", redactURL(c.BaseURL)),
		slog.String("model", c.Model),
		slog.String("version", c.Version),
		slog.String("api_key", redactedKey(c.APIKey)),
		slog.Duration("step_timeout", c.StepTimeout),
		slog.Int("retries", c.Retries),
		slog.Int("max_inflight", c.MaxInflight),
	}
	if c.MaxTokens > 0 {
		attrs = append(attrs, slog.Int("max_tokens", c.MaxTokens))
	}
	if c.Temperature != nil {
		attrs = append(attrs, slog.Float64("temperature", *c.Temperature))
	}
	if c.TopP != nil {
		attrs = append(attrs, slog.Float64("top_p", *c.TopP))
	}
	return slog.GroupValue(attrs...)
}

func redactedKey(key string) string {
	if key == "" {
		return "(none)"
	}
	return "[redacted]"
}

// secretKeyLen is the length from which a key is redacted wherever it
// occurs in a text. Real keys are longer (OpenAI's 51 characters and more,
// Hugging Face's 37, a random hex token 32) and never occur in a message
// by chance; a shorter key ("EMPTY", vLLM's usual dummy, or "k") is a
// word or a letter that server messages are full of.
const secretKeyLen = 16

// redactKey replaces key in s with "[redacted]". A key of secretKeyLen
// bytes or more is replaced wherever it occurs, even inside a longer word,
// where a server may have glued it. A shorter one only where it stands as
// a token of its own, as an echo shows it ("Bearer EMPTY", "key k is not
// valid", "api_key=k&", a quoted "k"): replacing each of its occurrences
// would mangle every "key" and "EMPTY_PROMPT" of a message.
func redactKey(s, key string) string {
	if key == "" {
		return s
	}
	if len(key) >= secretKeyLen {
		return strings.ReplaceAll(s, key, "[redacted]")
	}
	var b strings.Builder
	i := 0 // s[:i] is written
	for from := 0; ; {
		j := strings.Index(s[from:], key)
		if j < 0 {
			break
		}
		start, end := from+j, from+j+len(key)
		if start > 0 && isKeyByte(s[start-1]) || end < len(s) && isKeyByte(s[end]) {
			// Part of a longer word; the next occurrence may overlap
			// this one (key "a.a" in "xa.a.a").
			from = start + 1
			continue
		}
		b.WriteString(s[i:start])
		b.WriteString("[redacted]")
		i, from = end, end
	}
	if i == 0 {
		return s
	}
	b.WriteString(s[i:])
	return b.String()
}

// isKeyByte reports whether b continues a word around a short key: a
// letter or digit (a byte of a non-ASCII letter too), '-' or '_'.
func isKeyByte(b byte) bool {
	return b == '-' || b == '_' || b >= 0x80 ||
		'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

// redactURL hides a password in a URL's user info.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
