// Package cdp is a small Chrome DevTools Protocol client: enough to list,
// open and close a browser's tabs through its remote-debugging port, which is
// what OSWorld's chrome_open_tabs and chrome_close_tabs setup steps do.
//
// The endpoint is the HTTP address of the debugging port as the host reaches
// it (for a VM, the 127.0.0.1 forward of the guest's port 9222). Client asks
// /json/version for the browser's websocket and speaks JSON-RPC over it.
package cdp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// Client reaches one browser's debugging endpoint.
type Client struct {
	endpoint *url.URL
	http     *http.Client
}

// New returns a client for the debugging endpoint, such as
// "http://127.0.0.1:40222". A nil httpClient means one without a proxy.
func New(endpoint string, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("cdp: endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("cdp: endpoint %q: want http://host:port", endpoint)
	}
	if httpClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		httpClient = &http.Client{Transport: tr}
	}
	return &Client{endpoint: u, http: httpClient}, nil
}

// Endpoint returns the debugging endpoint.
func (c *Client) Endpoint() string { return c.endpoint.String() }

// CloseIdleConnections closes idle HTTP connections to the endpoint.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Version is the answer of /json/version.
type Version struct {
	Browser              string `json:"Browser"`
	ProtocolVersion      string `json:"Protocol-Version"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// Version asks the browser who it is and where its websocket is.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	u := c.endpoint.JoinPath("/json/version").String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return v, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return v, fmt.Errorf("cdp: %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return v, fmt.Errorf("cdp: %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("cdp: %s: status %d: %s", u, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &v); err != nil || v.WebSocketDebuggerURL == "" {
		return v, fmt.Errorf("cdp: %s: no webSocketDebuggerUrl in %q", u, body)
	}
	return v, nil
}

// Dial opens the browser-level websocket.
func (c *Client) Dial(ctx context.Context) (*Conn, error) {
	v, err := c.Version(ctx)
	if err != nil {
		return nil, err
	}
	ws, err := url.Parse(v.WebSocketDebuggerURL)
	if err != nil {
		return nil, fmt.Errorf("cdp: websocket URL %q: %w", v.WebSocketDebuggerURL, err)
	}
	// The browser names the address it listens on inside the guest; the
	// host reaches it through the endpoint's forward instead.
	ws.Host = c.endpoint.Host
	conn, _, err := websocket.Dial(ctx, ws.String(), &websocket.DialOptions{HTTPClient: c.http})
	if err != nil {
		return nil, fmt.Errorf("cdp: dial %s: %w", ws, err)
	}
	conn.SetReadLimit(64 << 20)
	return &Conn{ws: conn, url: ws.String()}, nil
}

// Conn is a JSON-RPC session with the browser. Calls are serialized; events
// the browser sends meanwhile are skipped.
type Conn struct {
	mu     sync.Mutex
	ws     *websocket.Conn
	url    string
	nextID int64
}

// Error is an error answered by the browser.
type Error struct {
	Method  string
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("cdp: %s: %s (code %d)", e.Method, e.Message, e.Code)
}

// Call sends method with params and decodes the result into result (which
// may be nil).
func (c *Conn) Call(ctx context.Context, method string, params, result any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	id := c.nextID
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	raw, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("cdp: %s: %w", method, err)
	}
	if err := c.ws.Write(ctx, websocket.MessageText, raw); err != nil {
		return fmt.Errorf("cdp: %s: send: %w", method, err)
	}
	for {
		_, data, err := c.ws.Read(ctx)
		if err != nil {
			return fmt.Errorf("cdp: %s: read: %w", method, err)
		}
		var resp struct {
			ID     int64           `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *Error          `json:"error"`
		}
		if err := json.Unmarshal(data, &resp); err != nil {
			return fmt.Errorf("cdp: %s: bad message: %w", method, err)
		}
		if resp.ID != id {
			continue // an event, or an answer to a call given up on
		}
		if resp.Error != nil {
			resp.Error.Method = method
			return resp.Error
		}
		if result == nil {
			return nil
		}
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("cdp: %s: bad result: %w", method, err)
		}
		return nil
	}
}

// Close closes the session.
func (c *Conn) Close() error {
	if err := c.ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		// The browser did not finish the closing handshake: drop the
		// connection; there is nothing left to tell it.
		c.ws.CloseNow()
	}
	return nil
}

// TargetInfo describes one target (a tab, a worker, ...) of the browser.
type TargetInfo struct {
	TargetID         string `json:"targetId"`
	Type             string `json:"type"`
	Title            string `json:"title"`
	URL              string `json:"url"`
	Attached         bool   `json:"attached"`
	BrowserContextID string `json:"browserContextId,omitempty"`
}

// Tabs returns the browser's page targets (its tabs), in the browser's
// order.
func (c *Conn) Tabs(ctx context.Context) ([]TargetInfo, error) {
	var res struct {
		TargetInfos []TargetInfo `json:"targetInfos"`
	}
	if err := c.Call(ctx, "Target.getTargets", nil, &res); err != nil {
		return nil, err
	}
	var tabs []TargetInfo
	for _, t := range res.TargetInfos {
		if t.Type == "page" {
			tabs = append(tabs, t)
		}
	}
	return tabs, nil
}

// OpenTab opens a new tab at url and returns its target id. The page loads
// in the background.
func (c *Conn) OpenTab(ctx context.Context, url string) (string, error) {
	var res struct {
		TargetID string `json:"targetId"`
	}
	if err := c.Call(ctx, "Target.createTarget", map[string]any{"url": url}, &res); err != nil {
		return "", err
	}
	return res.TargetID, nil
}

// CloseTab closes the target id.
func (c *Conn) CloseTab(ctx context.Context, id string) error {
	var res struct {
		Success *bool `json:"success"`
	}
	if err := c.Call(ctx, "Target.closeTarget", map[string]any{"targetId": id}, &res); err != nil {
		return err
	}
	if res.Success != nil && !*res.Success {
		return &Error{Method: "Target.closeTarget", Message: "browser did not close target " + id}
	}
	return nil
}
