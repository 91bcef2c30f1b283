package policytest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// chat serves POST /v1/chat/completions: read the request, check it, play
// the fault it drew, generate the reply, and answer in the dialect's shape.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	n, inflight, done := s.admit()
	defer done()
	ctx := r.Context()
	// The body is read and the answer written without a worker: both
	// wait on the client more than they work.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		s.fail(w, &answerError{status: http.StatusBadRequest, msg: "cannot read request body: " + err.Error()})
		return
	}
	wk := &worker{s: s}
	defer wk.free()
	if !wk.take(ctx) {
		return
	}
	wr, err := parseRequest(body)
	if err != nil {
		s.fail(w, &answerError{status: http.StatusBadRequest, msg: err.Error()})
		return
	}
	req := wr.request(n, r.Header.Get("Authorization") != "")
	fault := s.drawFault(n, req)
	if e := s.check(&wr, req, fault); e != nil {
		s.fail(w, e)
		return
	}
	if !s.playFault(ctx, wk, w, fault, &wr) {
		return
	}
	g, ok := s.generate(ctx, wk, &wr, req, fault, inflight)
	if !ok {
		return
	}
	s.answer(w, wk, n, fault, s.shape(n, &wr, g, fault))
}

// admit counts a request in; done counts it out.
func (s *Server) admit() (n, inflight int, done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = s.n
	s.n++
	s.stats.Requests++
	s.stats.InFlight++
	inflight = s.stats.InFlight
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, inflight)
	return n, inflight, func() {
		s.mu.Lock()
		s.stats.InFlight--
		s.mu.Unlock()
	}
}

// drawFault picks the request's fault and keeps the request if asked.
func (s *Server) drawFault(n int, req Request) Fault {
	fault := NoFault
	if s.opts.Faults != nil {
		fault = s.opts.Faults(n, req)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.KeepRequests {
		s.requests = append(s.requests, req)
	}
	if fault != NoFault {
		s.stats.Faults++
	}
	return fault
}

// check refuses what the real server would refuse before generating.
func (s *Server) check(wr *wireRequest, req Request, fault Fault) *answerError {
	if s.opts.Dialect == OpenAI {
		var unknown []string
		for _, f := range req.Fields {
			if !openAIFields[f] {
				unknown = append(unknown, f)
			}
		}
		if len(unknown) > 0 {
			return s.refusal(unknown)
		}
	}
	bad := func(status int, msg, param string) *answerError {
		return &answerError{status: status, msg: msg, param: param}
	}
	switch {
	case wr.Stream:
		return bad(http.StatusBadRequest, "streaming is not supported by the scripted server", "stream")
	case wr.Model == "":
		return bad(http.StatusBadRequest, "model is required", "model")
	case len(wr.Messages) == 0:
		return bad(http.StatusBadRequest, "messages must not be empty", "messages")
	case s.opts.Model != "" && wr.Model != s.opts.Model:
		return bad(http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", wr.Model), "model")
	case s.opts.TextOnly && req.Images > 0:
		return bad(http.StatusBadRequest, fmt.Sprintf("model %s is not a multimodal model: image input is not supported", wr.Model), "messages")
	case s.opts.ImageLimit > 0 && req.Images > s.opts.ImageLimit:
		return bad(http.StatusBadRequest, fmt.Sprintf(s.rel.limitWording, s.opts.ImageLimit), s.rel.limitParam)
	case fault == FaultRefuseField && req.ReturnTokenIDs:
		return s.refusal([]string{"return_token_ids"})
	case fault == FaultValidationError:
		return validationError(wr, "`top_logprobs` must be a positive value.")
	}
	return nil
}

// playFault plays the faults that come before a reply; it reports whether
// to go on and answer.
func (s *Server) playFault(ctx context.Context, wk *worker, w http.ResponseWriter, fault Fault, wr *wireRequest) bool {
	switch fault {
	case FaultHang:
		wk.free()
		select {
		case <-ctx.Done():
		case <-s.closed:
		}
		return false
	case FaultServerError:
		s.fail(w, &answerError{status: http.StatusInternalServerError, msg: "scripted internal server error"})
		return false
	case FaultRateLimit:
		secs := int(math.Ceil(s.opts.RetryAfter.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.fail(w, &answerError{status: http.StatusTooManyRequests, msg: "rate limit reached, retry later"})
		return false
	case FaultFlatError:
		s.writeError(w, http.StatusInternalServerError, flatError, "scripted internal server error", "")
		return false
	case FaultUnauthorizedString:
		s.writeError(w, http.StatusUnauthorized, stringError, "Unauthorized", "")
		return false
	case FaultSlowFirstByte:
		return wk.sleep(ctx, s.opts.FirstByteDelay)
	case FaultUnavailable:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "no healthy upstream")
		return false
	case FaultHTML:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "<!DOCTYPE html><html><head><title>Service maintenance</title></head><body><h1>Back soon</h1></body></html>")
		return false
	}
	return true
}

// generation is a reply and the prompt it answers.
type generation struct {
	toks   []genToken // the end-of-turn token last, unless cut by max_tokens
	text   string     // what the tokens spell: no end-of-turn token
	finish string

	promptIDs []int64
	cached    int
	images    int
}

// generate runs the script, tokenizes the reply, serves the prompt from the
// prefix cache and waits as the latency model says; it reports false when
// the request was given up meanwhile.
func (s *Server) generate(ctx context.Context, wk *worker, wr *wireRequest, req Request, fault Fault, inflight int) (*generation, bool) {
	g := &generation{toks: generate(s.script(req)), finish: "stop", images: req.Images}
	if wr.MaxTokens > 0 && len(g.toks) > wr.MaxTokens {
		g.toks, g.finish = g.toks[:wr.MaxTokens], "length"
	}
	if fault == FaultAbort {
		// The engine stopped it midway: no end-of-turn token.
		g.toks, g.finish = g.toks[:len(g.toks)/2], "abort"
	}
	g.text = spelled(g.toks)
	var keys []uint64
	g.promptIDs, keys = promptTokens(wr.Messages, s.opts.ImageTokens)

	s.mu.Lock()
	g.cached = s.cache.serve(keys)
	s.mu.Unlock()

	if !s.opts.NoLatency {
		d := s.latency.Duration(inflight, len(g.promptIDs)-g.cached, len(g.toks))
		if !wk.sleep(ctx, d) {
			return nil, false
		}
	}
	s.mu.Lock()
	s.stats.Completed++
	s.stats.PromptTokens += len(g.promptIDs)
	s.stats.CachedTokens += g.cached
	s.stats.CompletionTokens += len(g.toks)
	s.mu.Unlock()
	return g, true
}

// answer writes the reply, or the broken body a fault asks for.
func (s *Server) answer(w http.ResponseWriter, wk *worker, n int, fault Fault, resp *wireResponse) {
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
		b := mustJSON(resp)
		wk.free()
		writeBody(w, http.StatusOK, b)
	}
}

// worker is a request's hold on one of the server's workers
// (Options.Workers): taken to work on the request, given back while it
// waits.
type worker struct {
	s    *Server
	held bool
}

// take waits for a worker; it reports false if ctx ends or the server
// closes first.
func (wk *worker) take(ctx context.Context) bool {
	if wk.s.workers == nil || wk.held {
		return true
	}
	select {
	case wk.s.workers <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-wk.s.closed:
		return false
	}
	wk.held = true
	wk.s.mu.Lock()
	wk.s.stats.Working++
	wk.s.stats.MaxWorking = max(wk.s.stats.MaxWorking, wk.s.stats.Working)
	wk.s.mu.Unlock()
	return true
}

// free gives the worker back, if held.
func (wk *worker) free() {
	if !wk.held {
		return
	}
	wk.held = false
	wk.s.mu.Lock()
	wk.s.stats.Working--
	wk.s.mu.Unlock()
	<-wk.s.workers
}

// sleep waits d without a worker (a real server's wait costs it no CPU)
// and takes one again after; it reports whether both happened.
func (wk *worker) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	wk.free()
	return sleep(ctx, wk.s.closed, d) && wk.take(ctx)
}

// sleep waits d unless ctx is done or the server closes first; it reports
// whether the full wait elapsed. Not backoff.Sleep: Close must release the
// requests the server holds (a hang, the latency model), and a request's
// ctx does not end on Close.
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
