// Package policytest is a scripted model server: a real HTTP server that
// speaks the OpenAI chat-completions wire format the way vLLM, SGLang or a
// hosted OpenAI endpoint does, with replies from a script instead of a
// model. It backs the policy client's tests, the README's no-GPU quickstart
// (`legato rl serve-policy`) and users wiring up a trainer.
//
// Replies are tokenized deterministically into token ids with negative
// logprobs; prompts go through a block-granular prefix-cache model, so
// cached_tokens behaves like a real server's (siblings of a group and
// successive steps hit, dropping an old screenshot misses); a latency model
// makes requests slower as more are in flight; and faults (hangs, 5xx, 429,
// refused fields, broken bodies) can be injected per request.
package policytest

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"legato/rl/schema"
)

// Dialect is the flavour of OpenAI compatibility a server speaks.
type Dialect string

const (
	// VLLM puts token_ids on each choice and prompt_token_ids at the top
	// level when asked with return_token_ids, reports cached tokens in
	// usage.prompt_tokens_details, and nests error bodies.
	VLLM Dialect = "vllm"
	// SGLang puts token_ids and prompt_token_ids on each choice, reports
	// cached tokens only when there are some, and sends flat error bodies.
	SGLang Dialect = "sglang"
	// OpenAI returns no token ids and refuses unknown request fields with a
	// 400 naming them.
	OpenAI Dialect = "openai"
)

// Defaults for Options.
const (
	DefaultImageTokens    = 256
	DefaultRetryAfter     = time.Second
	DefaultFirstByteDelay = 5 * time.Second
	// DefaultModelName is the model /v1/models lists when Options.Model is
	// empty.
	DefaultModelName = "legato-scripted"
)

// maxBody bounds a request body: 20 screenshots as data URLs fit easily.
const maxBody = 256 << 20

// Options configure a Server. The zero value is a vLLM-dialect server with
// the default script, prefix cache and latency model.
type Options struct {
	// Dialect defaults to VLLM.
	Dialect Dialect
	// Model is the served model name; a request naming another model gets
	// 404. Empty serves any name.
	Model string
	// APIKey, when set, must be sent as a bearer token; otherwise the
	// request gets 401 in the dialect's style.
	APIKey string
	// Script gives the reply text for a request; nil means DefaultScript.
	Script func(req Request) string
	// SplitReasoning returns a leading <think>…</think> of the reply in the
	// dialect's reasoning field (vLLM "reasoning", SGLang
	// "reasoning_content") instead of the content, like a reasoning parser.
	SplitReasoning bool
	// ToolCalls returns the reply's <tool_call>{…}</tool_call> blocks as
	// OpenAI tool_calls, like vLLM's hermes tool-call parser.
	ToolCalls bool
	// NoCacheReport leaves cached tokens out of usage, as vLLM does without
	// --enable-prompt-tokens-details and SGLang without
	// --enable-cache-report. The OpenAI dialect always reports them.
	NoCacheReport bool
	// TextOnly refuses images with a 400, like a server whose model has no
	// vision encoder.
	TextOnly bool
	// ImageTokens is the number of prompt tokens per image; zero means
	// DefaultImageTokens.
	ImageTokens int
	// CacheBlocks is the prefix cache's capacity in blocks of BlockSize
	// tokens; zero means DefaultCacheBlocks.
	CacheBlocks int
	// Latency is the latency model; zero means DefaultLatency().
	Latency Latency
	// NoLatency answers as fast as possible, for tests.
	NoLatency bool
	// Faults picks the fault of the n-th request (n from 0); nil means none.
	Faults func(n int, req Request) Fault
	// RetryAfter is the delay FaultRateLimit asks for; zero means
	// DefaultRetryAfter. It is sent in whole seconds, rounded up.
	RetryAfter time.Duration
	// FirstByteDelay is how long FaultSlowFirstByte waits; zero means
	// DefaultFirstByteDelay.
	FirstByteDelay time.Duration
	// KeepRequests keeps every request for Requests.
	KeepRequests bool
}

// Stats are a server's counters.
type Stats struct {
	// Requests counts chat-completion requests received; Completed those
	// answered 200 with a reply; Faults those given a fault.
	Requests  int
	Completed int
	Faults    int
	// InFlight is the number of requests being served; MaxInFlight its
	// highest value so far.
	InFlight    int
	MaxInFlight int
	// Token totals over completed requests.
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
}

// Server is a scripted model server. Its base URL (URL) is what a policy
// client takes as BaseURL.
type Server struct {
	opts    Options
	script  func(Request) string
	latency Latency

	baseURL   string
	httpSrv   *http.Server
	client    *http.Client
	closed    chan struct{} // closed by Close; releases hanging requests
	closeOnce sync.Once
	serveDone chan struct{}
	conns     sync.WaitGroup

	mu       sync.Mutex
	n        int
	stats    Stats
	cache    *prefixCache
	requests []Request
}

func newServer(opts Options) (*Server, error) {
	switch opts.Dialect {
	case "":
		opts.Dialect = VLLM
	case VLLM, SGLang, OpenAI:
	default:
		return nil, fmt.Errorf("unknown dialect %q: want vllm, sglang or openai", opts.Dialect)
	}
	if opts.ImageTokens <= 0 {
		opts.ImageTokens = DefaultImageTokens
	}
	if opts.CacheBlocks <= 0 {
		opts.CacheBlocks = DefaultCacheBlocks
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.FirstByteDelay <= 0 {
		opts.FirstByteDelay = DefaultFirstByteDelay
	}
	s := &Server{
		opts:      opts,
		script:    opts.Script,
		latency:   opts.Latency.withDefaults(),
		closed:    make(chan struct{}),
		serveDone: make(chan struct{}),
		cache:     newPrefixCache(opts.CacheBlocks),
	}
	if s.script == nil {
		s.script = DefaultScript
	}
	return s, nil
}

// NewServer starts a server on a free port of 127.0.0.1, like
// httptest.NewServer; it panics if opts are invalid or it cannot listen.
// Close it when done.
func NewServer(opts Options) *Server {
	s, err := Listen("127.0.0.1:0", opts)
	if err != nil {
		panic("policytest: " + err.Error())
	}
	return s
}

// Listen starts a server on addr, which must be a loopback address
// ("127.0.0.1:8000", "[::1]:0", "localhost:8000").
func Listen(addr string, opts Options) (*Server, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s.client = &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 256,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	s.start(ln, "http://"+ln.Addr().String()+"/v1")
	return s, nil
}

// NewPipeServer starts a server on an in-memory network (net.Pipe): no
// socket is opened, and inside a testing/synctest bubble every wait (the
// latency model, a hang, a client's timeout) runs on the bubble's fake
// clock. Only the http.Client from Client reaches it. Create it inside the
// bubble and Close it before the bubble ends.
func NewPipeServer(opts Options) *Server {
	s, err := newServer(opts)
	if err != nil {
		panic("policytest: " + err.Error())
	}
	ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	s.client = &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 256,
		DialContext:         ln.dial,
	}}
	s.start(ln, "http://policytest.pipe/v1")
	return s
}

func (s *Server) start(ln net.Listener, baseURL string) {
	s.baseURL = baseURL
	s.httpSrv = &http.Server{
		Handler: s,
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.conns.Done()
			}
		},
	}
	go func() {
		defer close(s.serveDone)
		_ = s.httpSrv.Serve(ln) // returns ErrServerClosed after Close
	}()
}

// URL is the server's OpenAI base URL, ending in /v1.
func (s *Server) URL() string { return s.baseURL }

// Client returns an HTTP client that reaches the server; for a pipe server
// it is the only one.
func (s *Server) Client() *http.Client { return s.client }

// Close stops the server: hanging requests are released, connections are
// closed, and Close returns once every connection's goroutine has exited.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		if s.client != nil {
			s.client.CloseIdleConnections()
		}
		if s.httpSrv != nil {
			_ = s.httpSrv.Close()
			<-s.serveDone
			s.conns.Wait()
		}
	})
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Requests returns the requests received so far when Options.KeepRequests
// is set.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ListenAndServe serves on addr (a loopback address) until ctx is done,
// then closes the server and returns nil.
func ListenAndServe(ctx context.Context, addr string, opts Options) error {
	s, err := Listen(addr, opts)
	if err != nil {
		return err
	}
	<-ctx.Done()
	s.Close()
	return nil
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("address %q is not a loopback address: the scripted server only listens on 127.0.0.1 or ::1", addr)
}

// ServeHTTP implements http.Handler: POST /v1/chat/completions,
// GET /v1/models and GET /health.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if path == "/health" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if s.opts.APIKey != "" && !s.authorized(r) && (path == "/v1/models" || path == "/v1/chat/completions") {
		if path == "/v1/chat/completions" {
			s.mu.Lock()
			s.n++
			s.stats.Requests++
			s.mu.Unlock()
		}
		s.unauthorized(w)
		return
	}
	switch {
	case path == "/v1/chat/completions" && r.Method == http.MethodPost:
		s.chat(w, r)
	case path == "/v1/models" && r.Method == http.MethodGet:
		s.models(w)
	default:
		s.writeError(w, http.StatusNotFound, s.errorShape(), fmt.Sprintf("%s %s not found", r.Method, r.URL.Path), "")
	}
}

func (s *Server) authorized(r *http.Request) bool {
	got := r.Header.Get("Authorization")
	want := "Bearer " + s.opts.APIKey
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) unauthorized(w http.ResponseWriter) {
	if s.opts.Dialect == OpenAI {
		s.writeError(w, http.StatusUnauthorized, nestedError, "Incorrect API key provided.", "")
		return
	}
	s.writeError(w, http.StatusUnauthorized, stringError, "Unauthorized", "")
}

func (s *Server) servedModel() string {
	if s.opts.Model != "" {
		return s.opts.Model
	}
	return DefaultModelName
}

func (s *Server) models(w http.ResponseWriter) {
	owner := string(s.opts.Dialect)
	if s.opts.Dialect == OpenAI {
		owner = "system"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.servedModel(), "object": "model", "created": 0, "owned_by": owner,
		}},
	})
}

// openAIFields are the request fields the OpenAI dialect accepts.
var openAIFields = map[string]bool{
	"model": true, "messages": true, "logprobs": true, "top_logprobs": true,
	"max_tokens": true, "max_completion_tokens": true, "temperature": true,
	"top_p": true, "n": true, "stop": true, "seed": true, "tools": true,
	"tool_choice": true, "parallel_tool_calls": true, "stream": true,
	"stream_options": true, "presence_penalty": true, "frequency_penalty": true,
	"logit_bias": true, "user": true, "response_format": true,
	"reasoning_effort": true, "metadata": true, "store": true,
	"service_tier": true, "modalities": true, "prediction": true,
	"prompt_cache_key": true, "safety_identifier": true, "verbosity": true,
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := s.n
	s.n++
	s.stats.Requests++
	s.stats.InFlight++
	inflight := s.stats.InFlight
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, inflight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.stats.InFlight--
		s.mu.Unlock()
	}()
	ctx := r.Context()

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		s.writeError(w, http.StatusBadRequest, s.errorShape(), "cannot read request body: "+err.Error(), "")
		return
	}
	wr, err := parseRequest(body)
	if err != nil {
		s.writeError(w, http.StatusBadRequest, s.errorShape(), err.Error(), "")
		return
	}
	req := newRequest(n, wr.Model, wr.Messages)
	req.Fields = wr.Fields
	req.Logprobs = wr.Logprobs
	req.ReturnTokenIDs = wr.ReturnTokenIDs
	req.MaxTokens = wr.MaxTokens
	req.Authorized = r.Header.Get("Authorization") != ""

	fault := NoFault
	if s.opts.Faults != nil {
		fault = s.opts.Faults(n, req)
	}
	s.mu.Lock()
	if s.opts.KeepRequests {
		s.requests = append(s.requests, req)
	}
	if fault != NoFault {
		s.stats.Faults++
	}
	s.mu.Unlock()

	if s.opts.Dialect == OpenAI {
		var unknown []string
		for _, f := range req.Fields {
			if !openAIFields[f] {
				unknown = append(unknown, f)
			}
		}
		if len(unknown) > 0 {
			s.refuseFields(w, unknown)
			return
		}
	}
	switch {
	case wr.Stream:
		s.writeError(w, http.StatusBadRequest, s.errorShape(), "streaming is not supported by the scripted server", "stream")
		return
	case wr.Model == "":
		s.writeError(w, http.StatusBadRequest, s.errorShape(), "model is required", "model")
		return
	case len(wr.Messages) == 0:
		s.writeError(w, http.StatusBadRequest, s.errorShape(), "messages must not be empty", "messages")
		return
	case s.opts.Model != "" && wr.Model != s.opts.Model:
		s.writeError(w, http.StatusNotFound, s.errorShape(), fmt.Sprintf("The model `%s` does not exist.", wr.Model), "model")
		return
	case s.opts.TextOnly && req.Images > 0:
		s.writeError(w, http.StatusBadRequest, s.errorShape(), fmt.Sprintf("model %s is not a multimodal model: image input is not supported", wr.Model), "messages")
		return
	}

	returnIDs := req.ReturnTokenIDs && s.opts.Dialect != OpenAI
	logprobs := req.Logprobs
	switch fault {
	case FaultHang:
		select {
		case <-ctx.Done():
		case <-s.closed:
		}
		return
	case FaultServerError:
		s.writeError(w, http.StatusInternalServerError, s.errorShape(), "scripted internal server error", "")
		return
	case FaultRateLimit:
		secs := int(math.Ceil(s.opts.RetryAfter.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.writeError(w, http.StatusTooManyRequests, s.errorShape(), "rate limit reached, retry later", "")
		return
	case FaultRefuseField:
		if req.ReturnTokenIDs {
			s.refuseFields(w, []string{"return_token_ids"})
			return
		}
	case FaultIgnoreField:
		returnIDs = false
	case FaultFlatError:
		s.writeError(w, http.StatusInternalServerError, flatError, "scripted internal server error", "")
		return
	case FaultUnauthorizedString:
		s.writeError(w, http.StatusUnauthorized, stringError, "Unauthorized", "")
		return
	case FaultSlowFirstByte:
		if !sleep(ctx, s.closed, s.opts.FirstByteDelay) {
			return
		}
	case FaultNoLogprobs:
		logprobs = false
	}

	raw := s.script(req)
	toks := pieces(raw)
	finish := "stop"
	if req.MaxTokens > 0 && len(toks) > req.MaxTokens {
		toks, finish = toks[:req.MaxTokens], "length"
	}
	text := strings.Join(toks, "")
	ids := make([]int64, len(toks))
	for i, p := range toks {
		ids[i] = tokenID(p)
	}
	promptIDs, keys := promptTokens(wr.Messages, s.opts.ImageTokens)

	s.mu.Lock()
	cached := s.cache.serve(keys)
	s.mu.Unlock()

	if !s.opts.NoLatency {
		d := s.latency.Duration(inflight, len(promptIDs)-cached, len(toks))
		if !sleep(ctx, s.closed, d) {
			return
		}
	}

	var reasoning string
	content := text
	if s.opts.SplitReasoning {
		reasoning, content = splitReasoning(text)
	}
	var calls []wireToolCall
	if s.opts.ToolCalls && finish != "length" {
		calls, content = extractToolCalls(content, n)
		if len(calls) > 0 {
			finish = "tool_calls"
		}
	}
	choice := wireChoice{
		FinishReason: finish,
		Message:      wireMessageOut{Role: "assistant", ToolCalls: calls},
	}
	if content != "" || len(calls) == 0 {
		choice.Message.Content = &content
	}
	if reasoning != "" {
		switch s.opts.Dialect {
		case VLLM:
			choice.Message.Reasoning = &reasoning
		case SGLang:
			choice.Message.ReasoningContent = &reasoning
		}
	}
	if logprobs {
		lp := &wireLogprobs{Content: make([]wireTokenLogprob, len(toks))}
		for i, p := range toks {
			b := make([]int, len(p))
			for j := range len(p) {
				b[j] = int(p[j])
			}
			lp.Content[i] = wireTokenLogprob{Token: p, Logprob: logprob(ids[i], i), Bytes: b, TopLogprobs: []struct{}{}}
		}
		if fault == FaultLogprobsMismatch && len(lp.Content) > 0 {
			lp.Content = lp.Content[:len(lp.Content)-1]
		}
		choice.Logprobs = lp
	}
	resp := wireResponse{
		ID:      fmt.Sprintf("chatcmpl-%d", n),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   wr.Model,
		Usage: wireUsage{
			PromptTokens:     len(promptIDs),
			CompletionTokens: len(toks),
			TotalTokens:      len(promptIDs) + len(toks),
		},
	}
	switch s.opts.Dialect {
	case VLLM:
		resp.PromptTokenIDs = jsonNull
		choice.TokenIDs = jsonNull
		if returnIDs {
			resp.PromptTokenIDs = mustJSON(promptIDs)
			choice.TokenIDs = mustJSON(ids)
		}
		if !s.opts.NoCacheReport {
			resp.Usage.PromptTokensDetails = &wireTokensDetails{CachedTokens: cached}
		}
	case SGLang:
		if returnIDs {
			choice.PromptTokenIDs = mustJSON(promptIDs)
			choice.TokenIDs = mustJSON(ids)
		}
		if !s.opts.NoCacheReport && cached > 0 {
			resp.Usage.PromptTokensDetails = &wireTokensDetails{CachedTokens: cached}
		}
	case OpenAI:
		resp.Usage.PromptTokensDetails = &wireTokensDetails{CachedTokens: cached}
	}
	resp.Choices = []wireChoice{choice}

	s.mu.Lock()
	s.stats.Completed++
	s.stats.PromptTokens += len(promptIDs)
	s.stats.CachedTokens += cached
	s.stats.CompletionTokens += len(toks)
	s.mu.Unlock()

	switch fault {
	case FaultMalformedJSON:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id": "chatcmpl-%d", "object": "chat.completion", "choices": [{"index": 0 "message": {}}]}`, n)
	case FaultTruncatedBody:
		b := mustJSON(resp)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b[:len(b)/2])
		_ = http.NewResponseController(w).Flush()
		// Drops the connection without finishing the response; net/http
		// does not log this sentinel.
		panic(http.ErrAbortHandler)
	default:
		writeJSON(w, http.StatusOK, resp)
	}
}

func (s *Server) refuseFields(w http.ResponseWriter, fields []string) {
	msg := "Unrecognized request argument supplied: " + strings.Join(fields, ", ")
	if s.opts.Dialect != OpenAI {
		msg = "unsupported field(s): " + strings.Join(fields, ", ")
	}
	s.writeError(w, http.StatusBadRequest, s.errorShape(), msg, fields[0])
}

// sleep waits d unless ctx is done or the server closes first; it reports
// whether the full wait elapsed.
func sleep(ctx context.Context, closed <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-closed:
		return false
	}
}

func splitReasoning(text string) (reasoning, content string) {
	rest, ok := strings.CutPrefix(strings.TrimLeft(text, " \n"), "<think>")
	if !ok {
		return "", text
	}
	reasoning, content, ok = strings.Cut(rest, "</think>")
	if !ok {
		return strings.TrimSpace(rest), ""
	}
	return strings.TrimSpace(reasoning), strings.TrimLeft(content, "\n")
}

// extractToolCalls moves <tool_call>{"name":…,"arguments":{…}}</tool_call>
// blocks out of content into OpenAI tool calls. Blocks that are not JSON
// stay in the content, as with vLLM's hermes parser.
func extractToolCalls(content string, n int) ([]wireToolCall, string) {
	var calls []wireToolCall
	var rest strings.Builder
	for {
		before, after, ok := strings.Cut(content, "<tool_call>")
		if !ok {
			rest.WriteString(content)
			break
		}
		body, tail, ok := strings.Cut(after, "</tool_call>")
		if !ok {
			rest.WriteString(content)
			break
		}
		var call struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(body), &call); err != nil || call.Name == "" {
			rest.WriteString(before + "<tool_call>" + body + "</tool_call>")
		} else {
			rest.WriteString(before)
			calls = append(calls, wireToolCall{
				ID:       fmt.Sprintf("call_%d_%d", n, len(calls)),
				Type:     "function",
				Function: wireFunction{Name: call.Name, Arguments: string(call.Arguments)},
			})
		}
		content = tail
	}
	return calls, strings.TrimSpace(rest.String())
}

// Error bodies come in three shapes across servers.
type errorShape int

const (
	nestedError errorShape = iota // {"error": {"message": …}}: OpenAI, recent vLLM
	flatError                     // {"object": "error", "message": …}: SGLang, old vLLM
	stringError                   // {"error": "Unauthorized"}: vLLM's --api-key check
)

func (s *Server) errorShape() errorShape {
	if s.opts.Dialect == SGLang {
		return flatError
	}
	return nestedError
}

func (s *Server) writeError(w http.ResponseWriter, status int, shape errorShape, msg, param string) {
	var p any
	if param != "" {
		p = param
	}
	typ := strings.ReplaceAll(http.StatusText(status), " ", "") + "Error"
	var code any = status
	if s.opts.Dialect == OpenAI {
		typ, code = "invalid_request_error", nil
		switch {
		case status == http.StatusUnauthorized:
			code = "invalid_api_key"
		case status == http.StatusNotFound:
			code = "model_not_found"
		case status == http.StatusTooManyRequests:
			typ, code = "requests", "rate_limit_exceeded"
		case status >= 500:
			typ = "server_error"
		}
	}
	var body any
	switch shape {
	case flatError:
		body = map[string]any{"object": "error", "message": msg, "type": typ, "param": p, "code": code}
	case stringError:
		body = map[string]any{"error": msg}
	default:
		body = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": code}}
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b := mustJSON(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

var jsonNull = json.RawMessage("null")

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own wire types are marshalled here.
		panic(fmt.Sprintf("policytest: marshal %T: %v", v, err))
	}
	return b
}

// wireRequest is the part of a request body the server reads.
type wireRequest struct {
	Model          string
	Messages       []schema.Message
	Fields         []string
	Logprobs       bool
	ReturnTokenIDs bool
	MaxTokens      int
	Stream         bool
}

func parseRequest(body []byte) (wireRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return wireRequest{}, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	var wr wireRequest
	for k := range fields {
		wr.Fields = append(wr.Fields, k)
	}
	slices.Sort(wr.Fields)
	get := func(name string, dst any) error {
		raw, ok := fields[name]
		if !ok || string(raw) == "null" {
			return nil
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("field %s: %v", name, err)
		}
		return nil
	}
	var msgs []wireMessageIn
	var maxTokens, maxCompletion int
	for _, err := range []error{
		get("model", &wr.Model),
		get("messages", &msgs),
		get("logprobs", &wr.Logprobs),
		get("return_token_ids", &wr.ReturnTokenIDs),
		get("max_tokens", &maxTokens),
		get("max_completion_tokens", &maxCompletion),
		get("stream", &wr.Stream),
	} {
		if err != nil {
			return wireRequest{}, err
		}
	}
	wr.MaxTokens = max(maxTokens, maxCompletion)
	for i, m := range msgs {
		if m.Role == "" {
			return wireRequest{}, fmt.Errorf("messages[%d]: role is required", i)
		}
		wr.Messages = append(wr.Messages, schema.Message{Role: m.Role, Content: m.Content})
	}
	return wr, nil
}

// wireMessageIn is a request message; content is a string or a list of
// parts.
type wireMessageIn struct {
	Role    string
	Content []schema.Part
}

func (m *wireMessageIn) UnmarshalJSON(b []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	m.Role = raw.Role
	switch {
	case len(raw.Content) == 0 || string(raw.Content) == "null":
	case raw.Content[0] == '"':
		var s string
		if err := json.Unmarshal(raw.Content, &s); err != nil {
			return err
		}
		m.Content = []schema.Part{schema.TextPart(s)}
	default:
		if err := json.Unmarshal(raw.Content, &m.Content); err != nil {
			return err
		}
		for i, p := range m.Content {
			switch p.Type {
			case "text":
			case "image_url":
				if p.ImageURL == nil || p.ImageURL.URL == "" {
					return fmt.Errorf("content[%d]: image_url part without a url", i)
				}
			default:
				return fmt.Errorf("content[%d]: unsupported part type %q", i, p.Type)
			}
		}
	}
	return nil
}

type wireResponse struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Created        int64           `json:"created"`
	Model          string          `json:"model"`
	Choices        []wireChoice    `json:"choices"`
	Usage          wireUsage       `json:"usage"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
}

type wireChoice struct {
	Index          int             `json:"index"`
	Message        wireMessageOut  `json:"message"`
	Logprobs       *wireLogprobs   `json:"logprobs"`
	FinishReason   string          `json:"finish_reason"`
	TokenIDs       json.RawMessage `json:"token_ids,omitempty"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
}

type wireMessageOut struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	Reasoning        *string        `json:"reasoning,omitempty"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
}

type wireToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type wireLogprobs struct {
	Content []wireTokenLogprob `json:"content"`
}

type wireTokenLogprob struct {
	Token       string     `json:"token"`
	Logprob     float64    `json:"logprob"`
	Bytes       []int      `json:"bytes"`
	TopLogprobs []struct{} `json:"top_logprobs"`
}

type wireUsage struct {
	PromptTokens        int                `json:"prompt_tokens"`
	CompletionTokens    int                `json:"completion_tokens"`
	TotalTokens         int                `json:"total_tokens"`
	PromptTokensDetails *wireTokensDetails `json:"prompt_tokens_details"`
}

type wireTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// pipeListener is a net.Listener whose connections are net.Pipe ends
// handed over by dial.
type pipeListener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, errors.Join(net.ErrClosed, client.Close(), server.Close())
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), client.Close(), server.Close())
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "policytest.pipe" }
