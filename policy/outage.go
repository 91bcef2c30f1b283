package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"legato/rl/internal/backoff"
)

// IsOutage reports whether err, from Complete, may be the server failing
// rather than this one request being bad: it could not be reached,
// dropped the connection or cut the body short, did not answer in time,
// answered any 5xx (a gateway's 502/503/504, or the 500 of an engine whose
// worker died behind a live HTTP front), or answered 200 with a body that
// is not a chat completion (a proxy's HTML page). A trainer restarting its
// server, a CUDA OOM or a load balancer with no backend cause exactly
// these, and so does an engine a trainer paused, which aborts what it is
// sent (finish_reason "abort"). Whether the server is really broken is for Ping to tell: a caller
// waits for Ping to succeed and sends the call again. A 4xx names the
// request (or the key, or the model) and is never an outage.
func IsOutage(err error) bool {
	if errors.Is(err, ErrNoReplica) {
		return true
	}
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return errors.Is(e.Err, ErrConnection) || errors.Is(e.Err, ErrTimeout) ||
		errors.Is(e.Err, ErrServer) || errors.Is(e.Err, ErrBadResponse) || errors.Is(e.Err, ErrAborted)
}

// MaxProbeInterval caps the backoff between two probes (Ping) of a server
// or replica that is down, for every prober: a server restarted between
// policy versions is found within 2 s of serving again (a 10 s cap cost
// 5.7 s after a 60 s restart), and a one-token generation every 2 s costs
// a server nothing.
const MaxProbeInterval = 2 * time.Second

// ProbeBackoff is the wait before the n-th probe (from 0) of a server that
// is down: from 250 ms, doubling, up to MaxProbeInterval.
func ProbeBackoff(n int) time.Duration { return probeBackoff.Wait(n) }

var probeBackoff = backoff.Policy{Base: 250 * time.Millisecond, Max: MaxProbeInterval}

// maxPingTimeout bounds one Ping (and StepTimeout too): a generation of
// one token is quick on a serving engine, but may queue behind the calls
// still in flight.
const maxPingTimeout = 30 * time.Second

// Ping asks the server whether it serves the model: a chat completion of
// one token (max_tokens 1) to the same model at the same URL. It succeeds
// only when that answers 200 with a chat completion. A listing (GET
// /models) is not enough: an engine whose worker died (CUDA OOM) behind a
// live HTTP front, or a gateway with no backend, still lists the model
// while every completion fails.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(maxPingTimeout, c.cfg.StepTimeout))
	defer cancel()
	body, err := json.Marshal(pingRequest{Model: c.cfg.Model, Messages: []chatMessage{{Role: "user", Content: "ping"}}, MaxTokens: 1})
	if err != nil {
		return c.newError(0, ErrBadResponse, err.Error(), err)
	}
	url := strings.TrimSuffix(c.cfg.BaseURL, "/") + "/chat/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return c.newError(0, ErrConnection, err.Error(), err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return c.newError(0, ErrTimeout, "ping: no answer to a one-token generation within the ping timeout", nil)
		}
		return c.newError(0, ErrConnection, "ping: "+c.redact(err.Error()), err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return c.newError(res.StatusCode, ErrConnection, "ping: the answer to a one-token generation was cut: "+c.redact(err.Error()), err)
	}
	if res.StatusCode != http.StatusOK {
		msg, _ := errorMessage(raw)
		e := c.classify(&statusError{status: res.StatusCode, message: msg})
		e.Message = capMessage(c.redact(fmt.Sprintf("ping: a one-token generation answered %d: %s", res.StatusCode, msg)))
		return e
	}
	var cc chatResponse
	if err := json.Unmarshal(raw, &cc); err != nil || len(cc.Choices) == 0 {
		return c.newError(res.StatusCode, ErrBadResponse, "ping: a one-token generation answered 200 with a body that is not a chat completion", nil)
	}
	if cc.Choices[0].FinishReason == finishAbort {
		// A paused engine aborts what it is sent: it does not serve yet.
		return c.newError(res.StatusCode, ErrAborted, "ping: the server aborted a one-token generation (paused?)", nil)
	}
	return nil
}

// pingRequest is Ping's generation: no logprobs, no token ids, no extras.
type pingRequest struct {
	Model     string        `json:"model"`
	Messages  []chatMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens"`
}

// Endpoint is the chat-completions URL calls go to, without credentials.
func (c *Client) Endpoint() string { return c.endpoint }
