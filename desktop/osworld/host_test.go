package osworld

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/guest/guesttest"
)

// Helpers for the tests that run the backend against legato's guest server
// on the host (guesttest: Xvfb, jwm, server.py), as a guest given by URL.

// hostGuest is a guest server on the host with what the tests need around
// it.
type hostGuest struct {
	*guesttest.Guest
	// App is a program name unique to this test: a link to xterm, so that
	// a fast reset that kills it cannot touch anything else on the host.
	App string
	// AppPath is where the link is.
	AppPath string
	// Bin is the directory first on the guest commands' PATH.
	Bin string
}

func startHostGuest(t *testing.T) *hostGuest {
	t.Helper()
	return startHostGuestWith(t, guesttest.Options{})
}

// startHostGuestWith is startHostGuest with the guest's options.
func startHostGuestWith(t *testing.T, opts guesttest.Options) *hostGuest {
	t.Helper()
	g := guesttest.Start(t, opts)
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	app := "lgtapp" + hex.EncodeToString(b[:]) // 12 bytes: within comm's 15
	bin := filepath.Join(filepath.Dir(g.Home), "bin")
	xterm, err := exec.LookPath("xterm")
	if err != nil {
		t.Fatal(err)
	}
	appPath := filepath.Join(t.TempDir(), app)
	if err := os.Symlink(xterm, appPath); err != nil {
		t.Fatal(err)
	}
	return &hostGuest{Guest: g, App: app, AppPath: appPath, Bin: bin}
}

// config returns a configuration for the host guest at url (the guest's
// own, or a proxy's).
func (g *hostGuest) config(t *testing.T, url string) Config {
	t.Helper()
	if err := os.MkdirAll(g.Tmp(), 0o1777); err != nil {
		t.Fatal(err)
	}
	return Config{
		Guests:      []GuestAddr{{URL: url}},
		Home:        g.Home,
		BaselineDir: filepath.Join(filepath.Dir(g.Home), "baseline"),
		// The guest is the host: a fast reset ends only the processes of
		// the guest's X display, and restores a /tmp of its own. Its user
		// is the test's, root under CI.
		FastReset: FastResetConfig{
			Shared:      true,
			RootDesktop: true,
			Restore:     []string{g.Tmp()},
			StateDir:    filepath.Join(filepath.Dir(g.Home), "clean"),
		},
		CacheDir: filepath.Join(filepath.Dir(g.Home), "cache"),
		Ready: ReadyConfig{
			Interval: 100 * time.Millisecond,
			// The host is the guest here: its load is the other tests'.
			MaxLoad:       1,
			AfterResetMax: 10 * time.Second,
			BeforeEvalMax: 5 * time.Second,
		},
		Grade:       GradeConfig{Mode: grade.NativeOnly},
		BootTimeout: 30 * time.Second,
		Logger:      testLogger(t),
	}
}

// Tmp is the directory the host guest's fast reset restores, as a VM's
// restores /tmp.
func (g *hostGuest) Tmp() string { return filepath.Join(filepath.Dir(g.Home), "tmp") }

// desktop attaches a desktop to the host guest through a pool of its own.
func (g *hostGuest) desktop(t *testing.T, cfg Config) *Desktop {
	t.Helper()
	p, err := NewPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.New(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.(*Desktop)
}

// sh runs a shell command in the guest and returns its output; a failure
// fails the test.
func (g *hostGuest) sh(t *testing.T, cmd string) string {
	t.Helper()
	res, err := g.Client.Execute(t.Context(), guest.ShellLine(cmd))
	if err != nil {
		t.Fatalf("guest %q: %v", cmd, err)
	}
	if res.ReturnCode != 0 {
		t.Fatalf("guest %q: exit %d: %s%s", cmd, res.ReturnCode, res.Output, res.Error)
	}
	return strings.TrimSpace(res.Output)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// tWriter sends log lines to t.Log, so they show with the failing test.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// hangProxy forwards requests to a guest server, except those it is told
// to hang: they wait until the client gives up. It makes a desktop's call
// block for real, inside the guest API, to test cancellation and Close.
type hangProxy struct {
	srv *httptest.Server
	// hang reports whether to hang a request (its path and body).
	hang func(path string, body []byte) bool
	// hung receives a value each time a request starts hanging.
	hung chan struct{}

	mu sync.Mutex
	// calls are the requests the proxy received since the last takeCalls.
	calls []proxyCall
}

// proxyCall is a request as the proxy saw it: its path, when it came and
// when its answer (or the client's cancel) ended it.
type proxyCall struct {
	path    string
	at, end time.Time
}

// takeCalls returns the requests the proxy ended since it was last called,
// in the order they ended.
func (h *hangProxy) takeCalls() []proxyCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

func newHangProxy(t *testing.T, target string, hang func(path string, body []byte) bool) *hangProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	// No idle connections to the guest: they would outlive the checks'
	// goroutine snapshots.
	rp.Transport = &http.Transport{DisableKeepAlives: true}
	h := &hangProxy{hang: hang, hung: make(chan struct{}, 16)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		defer func() {
			h.mu.Lock()
			h.calls = append(h.calls, proxyCall{path: r.URL.Path, at: at, end: time.Now()})
			h.mu.Unlock()
		}()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if h.hang != nil && h.hang(r.URL.Path, body) {
			select {
			case h.hung <- struct{}{}:
			default:
			}
			<-r.Context().Done()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// executeContains returns a hang rule for /execute requests whose command
// contains s.
func executeContains(s string) func(string, []byte) bool {
	return func(path string, body []byte) bool {
		return (path == "/execute" || path == "/setup/execute") && bytes.Contains(body, []byte(s))
	}
}

// task builds an OSWorld task from its JSON config.
func task(t *testing.T, id, domain, cfg string) desktop.Task {
	t.Helper()
	var c struct {
		Instruction string              `json:"instruction"`
		Config      []desktop.SetupStep `json:"config"`
		Evaluator   json.RawMessage     `json:"evaluator"`
	}
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	return desktop.Task{ID: id, Domain: domain, Instruction: c.Instruction, Setup: c.Config, Evaluator: c.Evaluator, Raw: json.RawMessage(cfg)}
}
