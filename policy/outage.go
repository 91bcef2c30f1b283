package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// IsOutage reports whether err, from Complete, looks like the server being
// away rather than refusing or failing this one request: it could not be
// reached, dropped the connection, did not answer in time, or a gateway in
// front of it said it is unavailable (502, 503, 504). A trainer that
// restarts or reloads its server between policy versions causes exactly
// these; a caller can wait for Ping to succeed and send the call again.
func IsOutage(err error) bool {
	if errors.Is(err, ErrNoReplica) {
		return true
	}
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch {
	case errors.Is(e.Err, ErrConnection), errors.Is(e.Err, ErrTimeout):
		return true
	case errors.Is(e.Err, ErrServer):
		return e.Status == http.StatusBadGateway || e.Status == http.StatusServiceUnavailable || e.Status == http.StatusGatewayTimeout
	}
	return false
}

// pingTimeout bounds one Ping.
const pingTimeout = 5 * time.Second

// Ping asks the server whether it is up, with GET BaseURL/models (served by
// vLLM, SGLang and OpenAI-compatible providers). Any HTTP answer but 502,
// 503 and 504 counts as up, a 404 or a 401 included: Ping tells whether
// the server is there, Complete's errors tell what is wrong with a call.
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(pingTimeout, c.cfg.StepTimeout))
	defer cancel()
	url := strings.TrimSuffix(c.cfg.BaseURL, "/") + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c.newError(0, ErrConnection, err.Error(), err)
	}
	if c.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return c.newError(0, ErrConnection, "ping: "+err.Error(), err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	switch res.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return c.newError(res.StatusCode, ErrServer, fmt.Sprintf("ping: GET /models answered %d", res.StatusCode), nil)
	}
	return nil
}

// Endpoint is the chat-completions URL calls go to, without credentials.
func (c *Client) Endpoint() string { return c.endpoint }
