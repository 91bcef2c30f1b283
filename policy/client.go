package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"golang.org/x/sync/semaphore"

	"legato/rl/internal/backoff"
	"legato/rl/schema"
)

// Warnings a Result may carry, recorded on the step.
const (
	// WarnLogprobsMismatch: the server returned a different number of
	// logprobs and token ids; both are kept as they came.
	WarnLogprobsMismatch = schema.WarnLogprobsMismatch
	// WarnNonFiniteLogprobs: the server sent a logprob as null (its NaN),
	// NaN or ±Inf; Response.Logprobs is left nil so that no number of
	// them can be used (see schema.WarnNonFiniteLogprobs).
	WarnNonFiniteLogprobs = schema.WarnNonFiniteLogprobs
	// WarnNoLogprobs: the reply has tokens but the server sent no logprobs.
	WarnNoLogprobs = "no_logprobs"
	// WarnNoExactTokenIDs: the server gave no exact token ids in any form
	// it was asked for; the step keeps token strings, which a trainer would
	// have to re-tokenize (a character split across tokens reads as
	// U+FFFD in each).
	WarnNoExactTokenIDs = "no_exact_token_ids"
)

// Result is one completed model call.
type Result struct {
	Response schema.Response
	// Model is the call's cost. Seconds runs from StartedAt to the end of
	// the last attempt, including waits between attempts; QueueS is the
	// wait for a MaxInflight slot before StartedAt.
	Model schema.ModelCall
	// ToolCalls are the OpenAI tool calls, when the server parsed them.
	ToolCalls []ToolCall
	// StartedAt is when the call was issued, after queueing.
	StartedAt time.Time
	// Warnings flag data problems (WarnLogprobsMismatch,
	// WarnNonFiniteLogprobs, WarnNoLogprobs, WarnNoExactTokenIDs).
	Warnings []string
	// PromptTokenIDs are the prompt's token ids when the server returned
	// them (vLLM at the top level, SGLang on the choice). Store them with
	// schema.Run.PutTokenIDs into Step.PromptTokenChunks.
	PromptTokenIDs []int64
	// WeightVersion is the version of the weights the server says
	// generated the answer (SGLang's weight_version); empty when it does
	// not say.
	WeightVersion string
}

// Client calls one model on one server. It is safe for concurrent use, and
// meant to be shared by every worker of a batch. Close it when done.
type Client struct {
	cfg      Config
	endpoint string // for errors and logs: BaseURL/chat/completions without credentials
	svc      openai.ChatCompletionService
	log      *slog.Logger
	sem      *semaphore.Weighted // nil: no cap
	own      *http.Transport     // the transport New made, closed by Close
	hc       *http.Client        // what the requests go through (Ping too)

	inflight atomic.Int64
	// mode is the token-id negotiation's idMode; refused the idFields the
	// server refused (see tokenids.go); cacheReported whether an answer
	// has shown that the server reports cached tokens.
	mode          atomic.Int32
	refused       atomic.Int32
	cacheReported atomic.Bool
}

// New returns a client for cfg, after validating it.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.StepTimeout == 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	cfg.Extra = maps.Clone(cfg.Extra)
	c := &Client{
		cfg:      cfg,
		endpoint: strings.TrimSuffix(redactURL(cfg.BaseURL), "/") + "/chat/completions",
		log:      cfg.Logger,
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxInflight > 0 {
		c.sem = semaphore.NewWeighted(int64(cfg.MaxInflight))
	}
	hc := cfg.HTTPClient
	if hc == nil {
		// The default transport keeps 2 idle connections per host, so a
		// batch of desktops would open and close connections all the time.
		conns := cfg.MaxInflight
		if conns == 0 {
			conns = 256
		}
		c.own = http.DefaultTransport.(*http.Transport).Clone()
		c.own.MaxIdleConns = conns
		c.own.MaxIdleConnsPerHost = conns
		hc = &http.Client{Transport: c.own}
	}
	c.hc = hc
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(hc),
		// The retry policy is ours: openai-go does not retry its own
		// per-attempt timeout, and would retry 5xx on its own schedule.
		option.WithMaxRetries(0),
		option.WithMiddleware(catchHTTPErrors),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	// NewChatCompletionService rather than openai.NewClient: the latter
	// would pick up OPENAI_API_KEY and OPENAI_BASE_URL from the
	// environment and send a key the user did not give us.
	c.svc = openai.NewChatCompletionService(opts...)
	return c, nil
}

// Close releases the idle connections of the client's own transport.
// Calls in flight are not affected.
func (c *Client) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// Config returns the client's configuration, with defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// InFlight is the number of calls issued and not yet finished (not counting
// those queued for a MaxInflight slot).
func (c *Client) InFlight() int { return int(c.inflight.Load()) }

// TokenIDSource reports how the client gets generated token ids from the
// server, once an answer has shown it; "" before. SourceStrings means the
// server gives no exact ids in any form the client knows.
func (c *Client) TokenIDSource() schema.TokenIDSource { return idMode(c.mode.Load()).settled() }

// RefusedFields lists the token-id request fields the server refused with
// a 400 naming them (a hosted API), which the client no longer sends.
func (c *Client) RefusedFields() []string { return c.refusedFields().names() }

// Complete sends msgs and returns the reply. Images must be data URLs.
//
// It waits for a MaxInflight slot, then makes up to Retries+1 attempts of
// at most StepTimeout each, all within (Retries+1)·StepTimeout. Two answers
// make it ask again at once, not counted as a retry: a 400 whose param or
// message names a token-id field it sent (the field is never sent again),
// and, once per client, an answer that ignored return_token_ids (it then
// asks with the older forms, see TokenIDSource).
//
// On failure the error is a *Error; once ctx is done it wraps ctx.Err().
// The Result is then still non-nil when the call was issued, and carries
// StartedAt and the Model timing and attempts, for the record.
func (c *Client) Complete(ctx context.Context, msgs []schema.Message) (*Result, error) {
	wire, err := messages(msgs)
	if err != nil {
		return nil, err
	}
	// The body of each set of token-id fields is built on first use and
	// reused by later attempts.
	var bodies [1 << len(idFieldNames)][]byte
	body := func(f idFields) ([]byte, error) {
		if bodies[f] == nil {
			req := chatRequest{Model: c.cfg.Model, Messages: wire, Logprobs: true,
				MaxTokens: c.cfg.MaxTokens, Temperature: c.cfg.Temperature, TopP: c.cfg.TopP,
				ReturnTokenIDs:         f&fieldReturnTokenIDs != 0,
				ReturnTokensAsTokenIDs: f&fieldTokensAsIDs != 0,
				ReturnMetaInfo:         f&fieldMetaInfo != 0,
				ReturnPromptTokenIDs:   f&fieldPromptTokenIDs != 0,
			}
			b, err := requestBody(req, c.cfg.Extra)
			if err != nil {
				return nil, err
			}
			bodies[f] = b
		}
		return bodies[f], nil
	}
	queued := time.Now()
	if c.sem != nil {
		if err := c.sem.Acquire(ctx, 1); err != nil {
			return nil, c.fail(0, 0, ctx.Err(), "cancelled while waiting for a free slot", nil)
		}
		defer c.sem.Release(1)
	}
	c.inflight.Add(1)
	defer c.inflight.Add(-1)

	start := time.Now()
	res := &Result{StartedAt: start}
	res.Model.QueueS = start.Sub(queued).Seconds()
	deadline := start.Add(time.Duration(c.cfg.Retries+1) * c.cfg.StepTimeout)
	retries, refusals := 0, 0
	askedAgain := false
	for attempt := 1; ; attempt++ {
		res.Model.Attempts = attempt
		mode := idMode(c.mode.Load())
		sent := mode.fields() &^ c.refusedFields()
		b, err := body(sent)
		if err != nil {
			return nil, err
		}
		again, e := c.attempt(ctx, b, mode, sent, min(c.cfg.StepTimeout, time.Until(deadline)), res)
		res.Model.Seconds = time.Since(start).Seconds()
		if e == nil {
			if again && !askedAgain && time.Until(deadline) > 0 {
				askedAgain = true
				continue
			}
			c.log.Debug("policy call", "url", c.endpoint, "seconds", res.Model.Seconds, "attempts", attempt)
			return res, nil
		}
		e.Attempts = attempt
		if ctx.Err() != nil {
			return res, c.fail(attempt, 0, ctx.Err(), "", nil)
		}
		if f := refusedFields(e, sent); f != 0 && refusals < len(idFieldNames) {
			// Hosted APIs refuse fields they do not know; token ids are a
			// bonus, logprobs are what the call cannot do without.
			c.log.Warn("policy server refused a token-id field; no longer sending it",
				"url", c.endpoint, "fields", strings.Join(f.names(), ","), "message", e.Message)
			c.refuse(f)
			refusals++
			continue
		}
		if e.Permanent || retries >= c.cfg.Retries {
			return res, e
		}
		wait := c.backoff(e, retries)
		if time.Until(deadline)-wait < time.Millisecond {
			return res, e
		}
		c.log.Warn("policy call failed; retrying", "url", c.endpoint, "attempt", attempt,
			"error", e.Error(), "wait", wait)
		if backoff.Sleep(ctx, wait) != nil {
			res.Model.Seconds = time.Since(start).Seconds()
			return res, c.fail(attempt, 0, ctx.Err(), "", nil)
		}
		retries++
	}
}

// retryBackoff is the first wait before retrying a 5xx or a connection
// error; it doubles with each retry, ten times at most. A timeout is
// retried at once (the attempt already waited StepTimeout) and a 429 after
// its Retry-After. No wait exceeds StepTimeout.
const (
	retryBackoff    = 500 * time.Millisecond
	maxRetryBackoff = retryBackoff << 10
)

func (c *Client) backoff(e *Error, retries int) time.Duration {
	switch {
	case errors.Is(e.Err, ErrTimeout):
		return 0
	case errors.Is(e.Err, ErrRateLimited) && e.retryAfter > 0:
		return min(e.retryAfter, c.cfg.StepTimeout)
	}
	return backoff.Policy{Base: retryBackoff, Max: min(maxRetryBackoff, c.cfg.StepTimeout)}.Wait(retries)
}

// errAttemptTimeout is the cause of an attempt's context when StepTimeout
// expires, to tell it apart from the caller's deadline.
var errAttemptTimeout = errors.New("attempt timed out")

// attempt makes one request, in token-id mode with fields sent, and fills
// res from the answer; e is nil on success, and again reports that the
// answer made the client change how it asks for ids.
func (c *Client) attempt(ctx context.Context, body []byte, mode idMode, sent idFields, timeout time.Duration, res *Result) (again bool, e *Error) {
	actx, cancel := context.WithTimeoutCause(ctx, timeout, errAttemptTimeout)
	defer cancel()
	var raw []byte
	_, err := c.svc.New(actx, openai.ChatCompletionNewParams{},
		option.WithRequestBody("application/json", body),
		option.WithResponseBodyInto(&raw))
	if err == nil {
		again, err = c.fill(res, raw, mode, sent)
	}
	if err == nil {
		return again, nil
	}
	if ctx.Err() == nil && errors.Is(context.Cause(actx), errAttemptTimeout) {
		return false, c.newError(0, ErrTimeout, fmt.Sprintf("no complete answer within %v", timeout), nil)
	}
	return false, c.classify(err)
}

func (c *Client) classify(err error) *Error {
	var se *statusError
	switch {
	case errors.As(err, &se):
		e := c.newError(se.status, nil, se.message, nil)
		e.param = c.redact(se.param)
		e.full = c.redact(se.message)
		e.retryAfter = se.retryAfter
		switch s := se.status; {
		case s == http.StatusTooManyRequests:
			e.Err = ErrRateLimited
		case s == http.StatusRequestTimeout:
			e.Err = ErrTimeout
		case s >= 500:
			e.Err = ErrServer
		case s == http.StatusUnauthorized || s == http.StatusForbidden:
			e.Err, e.Permanent = ErrUnauthorized, true
		case s == http.StatusNotFound:
			e.Err, e.Permanent = ErrNotFound, true
		default:
			e.Err, e.Permanent = ErrBadRequest, true
		}
		return e
	case errors.As(err, new(*StringIDsError)):
		// The server answers every call so: trying again changes nothing.
		e := c.newError(0, ErrBadResponse, err.Error(), err)
		e.Permanent = true
		return e
	case errors.Is(err, errBadCompletion):
		return c.newError(0, ErrBadResponse, err.Error(), nil)
	case errors.Is(err, errAborted):
		return c.newError(0, ErrAborted, "the server aborted the generation (finish_reason \"abort\"): paused or cancelled midway; its tokens are not a reply", nil)
	case isJSONError(err):
		return c.newError(0, ErrBadResponse, "response is not valid JSON: "+err.Error(), nil)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || isNetError(err):
		return c.newError(0, ErrConnection, err.Error(), err)
	default:
		// openai-go's own complaints about a 200 answer (wrong content
		// type, unreadable body) land here.
		return c.newError(0, ErrBadResponse, err.Error(), nil)
	}
}

func isJSONError(err error) bool {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syn) || errors.As(err, &typ)
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

func (c *Client) newError(status int, kind error, message string, cause error) *Error {
	return &Error{
		URL:     c.endpoint,
		Model:   c.cfg.Model,
		Status:  status,
		Message: capMessage(c.redact(message)),
		Err:     kind,
		cause:   cause,
	}
}

// fail is the error of a call the caller's ctx ended.
func (c *Client) fail(attempts, status int, ctxErr error, message string, cause error) *Error {
	e := c.newError(status, ctxErr, message, cause)
	e.Attempts = attempts
	return e
}

// redact removes the API key from text that came from elsewhere (server
// messages, transport errors), in case a server echoes it.
func (c *Client) redact(s string) string { return redactKey(s, c.cfg.APIKey) }

// catchHTTPErrors turns an HTTP error answer into a *statusError before
// openai-go sees it: openai-go only understands nested error bodies and
// loses the message of flat ones and of {"error": "Unauthorized"}.
func catchHTTPErrors(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	res, err := next(req)
	if err != nil || res.StatusCode < 400 {
		return res, err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	msg, param := errorMessage(body)
	if msg == "" {
		msg = http.StatusText(res.StatusCode)
	}
	return nil, &statusError{
		status:     res.StatusCode,
		message:    msg,
		param:      param,
		retryAfter: parseRetryAfter(res.Header.Get("Retry-After"), time.Now()),
	}
}

// errBadCompletion marks a 200 answer that parsed but is not a usable
// chat completion.
var errBadCompletion = errors.New("not a chat completion")

// errAborted marks a 200 answer whose generation the engine aborted.
var errAborted = errors.New("generation aborted")

// fill copies what a trainer needs from the answer raw, to a request in
// token-id mode with fields sent, into res. again reports that the
// client's way of asking changed and the call should ask once more.
func (c *Client) fill(res *Result, raw []byte, mode idMode, sent idFields) (again bool, err error) {
	var cc chatResponse
	if err := json.Unmarshal(raw, &cc); err != nil {
		if sid := stringIDs(raw, err); sid != nil {
			return false, sid
		}
		return false, err
	}
	if len(cc.Choices) == 0 {
		return false, fmt.Errorf("%w: the answer has no choices", errBadCompletion)
	}
	ch := &cc.Choices[0]
	if ch.FinishReason == finishAbort {
		return false, errAborted
	}
	msg := ch.Message
	r := schema.Response{Content: deref(msg.Content), FinishReason: string(ch.FinishReason)}
	r.Reasoning = deref(msg.Reasoning)
	if r.Reasoning == "" {
		r.Reasoning = deref(msg.ReasoningContent)
	}
	var tokens []string
	var nLogprobs, nonFinite int
	if ch.Logprobs != nil && len(ch.Logprobs.Content) > 0 {
		nLogprobs = len(ch.Logprobs.Content)
		r.Logprobs = make([]float64, nLogprobs)
		tokens = make([]string, nLogprobs)
		for i, t := range ch.Logprobs.Content {
			r.Logprobs[i] = t.Logprob.v
			tokens[i] = t.Token
			if !t.Logprob.finite {
				nonFinite++
			}
		}
	}
	if nonFinite > 0 {
		// Dropped whole rather than kept with placeholders: JSON cannot
		// carry NaN, and any number put in a missing one's place (0.0 most
		// of all) would train as if the server had sent it.
		r.Logprobs = nil
	}
	src, ids, err := generatedIDs(ch, sent)
	if err != nil {
		return false, err
	}
	r.TokenIDsSource = src
	if src.Exact() {
		r.TokenIDs = ids
	} else {
		r.Tokens = tokens
	}
	var completionTokens int
	if cc.Usage != nil {
		completionTokens = cc.Usage.CompletionTokens
	}

	var warnings []string
	if nonFinite > 0 {
		warnings = append(warnings, WarnNonFiniteLogprobs)
	}
	if src.Exact() && nLogprobs > 0 && len(r.TokenIDs) != nLogprobs {
		warnings = append(warnings, WarnLogprobsMismatch)
	}
	if nLogprobs == 0 && (len(r.TokenIDs) > 0 || completionTokens > 0) {
		warnings = append(warnings, WarnNoLogprobs)
	}
	if !src.Exact() && (len(tokens) > 0 || completionTokens > 0) {
		warnings = append(warnings, WarnNoExactTokenIDs)
	}
	var promptIDs []int64
	switch {
	case cc.PromptTokenIDs != nil:
		promptIDs = *cc.PromptTokenIDs
	case ch.PromptTokenIDs != nil:
		promptIDs = *ch.PromptTokenIDs
	}
	var calls []ToolCall
	for _, tc := range msg.ToolCalls {
		if tc.Function.Name != "" {
			calls = append(calls, ToolCall{Name: tc.Function.Name, Arguments: arguments(tc.Function.Arguments)})
		}
	}

	res.Response = r
	res.WeightVersion = ""
	if m := cc.Metadata; m != nil && m.WeightVersion != sglangDefaultVersion {
		res.WeightVersion = m.WeightVersion
	}
	res.ToolCalls = calls
	res.Warnings = warnings
	res.PromptTokenIDs = promptIDs
	res.Model.PromptTokens, res.Model.CompletionTokens, res.Model.CachedTokens = 0, 0, nil
	if u := cc.Usage; u != nil {
		res.Model.PromptTokens = u.PromptTokens
		res.Model.CompletionTokens = u.CompletionTokens
		res.Model.CachedTokens = c.cachedTokens(u.PromptTokensDetails)
	}
	return c.learn(mode, src, nLogprobs > 0), nil
}

// cachedTokens reads the cached-token count of an answer; nil when the
// answer does not tell. vLLM from 0.9 to mid-2026 sends null details when
// nothing was cached, SGLang none then; SGLang since mid-2026 sends
// details with image counts and cached_tokens 0 even with cache reporting
// off. So a count of 0 beside an image count proves nothing, and a missing
// count means 0 only once the server has shown it reports them.
func (c *Client) cachedTokens(d *chatTokensDetails) *int {
	if d != nil && d.CachedTokens != nil {
		n := *d.CachedTokens
		media := present(d.ImageTokens) || present(d.AudioTokens) || present(d.VideoTokens)
		if n > 0 || !media {
			c.cacheReported.Store(true)
			return &n
		}
	}
	if c.cacheReported.Load() {
		return new(0)
	}
	return nil
}

func present(v json.RawMessage) bool { return len(v) > 0 && string(v) != "null" }
