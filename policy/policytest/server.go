// Package policytest is a scripted model server: a real HTTP server that
// speaks the OpenAI chat-completions wire format the way vLLM, SGLang or a
// hosted OpenAI endpoint does, with replies from a script instead of a
// model. It backs the policy client's tests, the README's no-GPU quickstart
// (`legato rl serve-policy`) and users wiring up a trainer.
//
// It answers as a given release of its dialect does (Options.Version):
// how generated and prompt token ids come back (return_token_ids, vLLM's
// return_tokens_as_token_ids, SGLang's return_meta_info, or not at all) and
// how cached tokens are reported (null at 0 on vLLM before mid-2026, image
// token counts on SGLang since). Replies are tokenized deterministically the
// way real servers report them: the end-of-turn id ends the ids and is
// counted in completion_tokens but not in the text, a character split
// across byte tokens shows as U+FFFD in each token string. Prompts go
// through a block-granular prefix-cache model, so cached_tokens behaves
// like a real server's (siblings of a group and successive steps hit,
// dropping an old screenshot misses); a latency model makes requests
// slower as more are in flight; and faults (hangs, 5xx, 429, refused
// fields, validation errors, broken bodies) can be injected per request.
package policytest

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Dialect is the flavour of OpenAI compatibility a server speaks.
type Dialect string

const (
	// VLLM puts token_ids on each choice and prompt_token_ids at the top
	// level when asked with return_token_ids (since 0.10.2), reports cached
	// tokens in usage.prompt_tokens_details, and nests error bodies.
	VLLM Dialect = "vllm"
	// SGLang puts token_ids and prompt_token_ids on each choice (since
	// mid-2026), reports cached tokens only when there are some, and sends
	// flat error bodies.
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
	// Version is the release of the dialect to answer as (see Versions);
	// empty means Latest.
	Version Version
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
	// ImageLimit refuses a prompt with more images than this with vLLM's
	// 400, like vLLM started with --limit-mm-per-prompt '{"image": N}';
	// zero means no limit.
	ImageLimit int
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
	// Workers bounds the requests the server works on at once (reading,
	// tokenizing, answering); the others wait in line, as a real server
	// queues what its batch cannot take. Waits (the latency model, a
	// fault that hangs or delays) hold no worker. Zero means no bound.
	//
	// A server in the process of the batch it serves competes with the
	// batch for the CPU, which a real server on its own machine does not:
	// unbounded, a thousand requests at once fill the Go scheduler's run
	// queues ahead of the batch's record commits.
	Workers int
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
	// WeightVersion is the weight_version the SGLang dialect reports (in
	// metadata and meta_info); empty means SGLang's own "default". A
	// function, so a test can change it between requests.
	WeightVersion func() string
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
	// Working is the number of requests holding a worker (Options.Workers)
	// and MaxWorking its highest value so far; both stay 0 without a
	// bound.
	Working    int
	MaxWorking int
	// Token totals over completed requests.
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
}

// Server is a scripted model server. Its base URL (URL) is what a policy
// client takes as BaseURL.
type Server struct {
	opts    Options
	rel     release
	script  func(Request) string
	latency Latency

	baseURL   string
	httpSrv   *http.Server
	client    *http.Client
	closed    chan struct{} // closed by Close; releases hanging requests
	closeOnce sync.Once
	serveDone chan struct{}
	conns     sync.WaitGroup

	workers chan struct{} // a token per request worked on; nil without a bound

	mu       sync.Mutex
	n        int
	stats    Stats
	cache    *prefixCache
	requests []Request
}

// Validate reports what is wrong with the options, zero fields taken as
// their defaults; each error names the field and what it accepts.
func (o Options) Validate() error {
	var errs []error
	switch o.Dialect {
	case "", VLLM, SGLang, OpenAI:
		d := o.Dialect
		if d == "" {
			d = VLLM
		}
		if _, err := releaseOf(d, o.Version); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("unknown dialect %q: want vllm, sglang or openai", o.Dialect))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"ImageTokens", o.ImageTokens}, {"CacheBlocks", o.CacheBlocks}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d: want 1 or more (0 means the default)", n.name, n.v))
		}
	}
	if o.ImageLimit < 0 {
		errs = append(errs, fmt.Errorf("ImageLimit %d: want 0 (no limit) or more", o.ImageLimit))
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("Workers %d: want 0 (no bound) or more", o.Workers))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetryAfter", o.RetryAfter}, {"FirstByteDelay", o.FirstByteDelay}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration (0 means the default)", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

func newServer(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Dialect == "" {
		opts.Dialect = VLLM
	}
	if opts.Version == "" {
		opts.Version = Latest
	}
	rel, err := releaseOf(opts.Dialect, opts.Version)
	if err != nil {
		return nil, err
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
		rel:       rel,
		script:    opts.Script,
		latency:   opts.Latency.withDefaults(),
		closed:    make(chan struct{}),
		serveDone: make(chan struct{}),
		cache:     newPrefixCache(opts.CacheBlocks),
	}
	if s.script == nil {
		s.script = DefaultScript
	}
	if opts.Workers > 0 {
		s.workers = make(chan struct{}, opts.Workers)
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
// (see CheckAddr).
func Listen(addr string, opts Options) (*Server, error) {
	if err := CheckAddr(addr); err != nil {
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

// CheckAddr reports whether Listen can listen on addr: a loopback host
// and a port from 0 (any free port) to 65535, such as "127.0.0.1:8000",
// "[::1]:0" or "localhost:8000".
func CheckAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w: want HOST:PORT, e.g. 127.0.0.1:8000", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("address %q: port %q: want 0 (any free port) to 65535", addr, port)
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
