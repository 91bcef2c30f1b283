// Package cdptest is a fake browser debugging endpoint for tests: it serves
// /json/version and a websocket speaking the Target.* methods legato uses,
// over an in-memory list of tabs. No Chrome needed.
package cdptest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"legato/rl/desktop/osworld/cdp"
)

// Browser is a fake browser. Its methods are safe for concurrent use.
type Browser struct {
	// URL is the debugging endpoint, http://127.0.0.1:port.
	URL string

	mu        sync.Mutex
	tabs      []cdp.TargetInfo
	next      int
	notReady  int
	versionN  int
	failClose bool
}

// New starts a fake browser with one blank tab, like a freshly started
// Chrome, and stops it when the test ends.
func New(t testing.TB) *Browser {
	b := &Browser{}
	b.tabs = []cdp.TargetInfo{b.newTarget("about:blank")}
	mux := http.NewServeMux()
	mux.HandleFunc("/json/version", b.version)
	mux.HandleFunc("/devtools/browser/", b.session)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b.URL = srv.URL
	return b
}

// NotReadyFor makes the next n /json/version requests fail with 503, as a
// browser that is still starting does.
func (b *Browser) NotReadyFor(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.notReady = n
}

// VersionRequests returns how many /json/version requests came.
func (b *Browser) VersionRequests() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.versionN
}

// SetTabs replaces the tabs with pages at urls.
func (b *Browser) SetTabs(urls ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tabs = nil
	for _, u := range urls {
		b.tabs = append(b.tabs, b.newTarget(u))
	}
}

// TabURLs returns the URLs of the open tabs, in order.
func (b *Browser) TabURLs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var urls []string
	for _, t := range b.tabs {
		if t.Type == "page" {
			urls = append(urls, t.URL)
		}
	}
	return urls
}

func (b *Browser) newTarget(url string) cdp.TargetInfo {
	b.next++
	return cdp.TargetInfo{TargetID: fmt.Sprintf("T%d", b.next), Type: "page", URL: url, Title: url}
}

func (b *Browser) version(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.versionN++
	notReady := b.notReady > 0
	if notReady {
		b.notReady--
	}
	b.mu.Unlock()
	if notReady {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	// Like Chrome in a guest, name an address the host cannot use.
	json.NewEncoder(w).Encode(map[string]string{
		"Browser":              "FakeChrome/1.0",
		"Protocol-Version":     "1.3",
		"webSocketDebuggerUrl": "ws://localhost:1337/devtools/browser/fake",
	})
}

func (b *Browser) session(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := context.Background()
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		var req struct {
			ID     int64           `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if json.Unmarshal(data, &req) != nil {
			return
		}
		// Real browsers interleave events with answers.
		event, _ := json.Marshal(map[string]any{"method": "Target.targetInfoChanged", "params": map[string]any{}})
		if conn.Write(ctx, websocket.MessageText, event) != nil {
			return
		}
		result, cerr := b.handle(req.Method, req.Params)
		msg := map[string]any{"id": req.ID}
		if cerr != "" {
			msg["error"] = map[string]any{"code": -32000, "message": cerr}
		} else {
			msg["result"] = result
		}
		out, _ := json.Marshal(msg)
		if conn.Write(ctx, websocket.MessageText, out) != nil {
			return
		}
	}
}

func (b *Browser) handle(method string, params json.RawMessage) (any, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var p struct {
		URL      string `json:"url"`
		TargetID string `json:"targetId"`
	}
	json.Unmarshal(params, &p)
	switch method {
	case "Target.getTargets":
		infos := append([]cdp.TargetInfo{{TargetID: "W1", Type: "service_worker", URL: "chrome://sw"}}, b.tabs...)
		return map[string]any{"targetInfos": infos}, ""
	case "Target.createTarget":
		if !strings.Contains(p.URL, ":") {
			return nil, "Invalid url"
		}
		t := b.newTarget(p.URL)
		b.tabs = append(b.tabs, t)
		return map[string]any{"targetId": t.TargetID}, ""
	case "Target.closeTarget":
		for i, t := range b.tabs {
			if t.TargetID == p.TargetID {
				b.tabs = append(b.tabs[:i], b.tabs[i+1:]...)
				return map[string]any{"success": true}, ""
			}
		}
		return nil, "No target with given id found"
	}
	return nil, "'" + method + "' wasn't found"
}
