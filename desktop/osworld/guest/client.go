// Package guest is a client for the HTTP server that runs inside an OSWorld
// guest (port 5000): screenshots, commands, pyautogui actions, the /setup
// endpoints task setup uses, and file transfers in both directions.
//
// It speaks the API of OSWorld's own server, request and response shapes
// included, so it works against the guest image users already run; legato's
// test guest server (desktop/osworld/testdata/guest) speaks the same API.
//
// Every call is bounded by a per-call timeout (see Timeouts) on top of the
// caller's ctx. Errors are *Error values that say which call failed against
// which URL and classify the failure:
//
//   - errors.Is(err, ErrUnreachable): nothing answered (connection refused or
//     reset, or the call timed out before a response). A guest that is still
//     booting looks like this; so does one that died. IsNotReady reports it.
//   - errors.Is(err, ErrTimeout): the call's own timeout passed; it also
//     matches ErrUnreachable, since the guest did not finish answering.
//   - Status != 0: the guest answered with that HTTP status; the guest is up
//     but the request failed.
//   - an error wrapping the caller's ctx.Err(): the caller gave up.
package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Default per-call timeouts. OSWorld's server runs /execute commands for at
// most 120 s, so calls that run commands wait a little longer than that.
const (
	DefaultScreenshotTimeout    = 30 * time.Second
	DefaultExecuteTimeout       = 150 * time.Second
	DefaultLaunchTimeout        = 30 * time.Second
	DefaultOpenFileTimeout      = 120 * time.Second
	DefaultTransferTimeout      = 10 * time.Minute
	DefaultWindowTimeout        = 30 * time.Second
	DefaultAccessibilityTimeout = 60 * time.Second
	DefaultQueryTimeout         = 30 * time.Second
	// DefaultVerifySlack is added to an execute_with_verification call's own
	// max_wait_time: the command itself may run up to 120 s first.
	DefaultVerifySlack = 130 * time.Second
)

// Timeouts bound each kind of call. A zero field takes its Default… value.
type Timeouts struct {
	// Screenshot bounds GET /screenshot.
	Screenshot time.Duration
	// Execute bounds /execute and /setup/execute (and so RunPyautogui).
	Execute time.Duration
	// Launch bounds /setup/launch, which returns once the program started.
	Launch time.Duration
	// OpenFile bounds /setup/open_file. OSWorld's server waits up to 30
	// minutes for the opened file's window; the client asks it to give up
	// just before this bound (timeout_seconds) and stops waiting at it.
	OpenFile time.Duration
	// Transfer bounds /setup/upload and /file.
	Transfer time.Duration
	// Window bounds /setup/activate_window, /setup/close_window and
	// /setup/change_wallpaper.
	Window time.Duration
	// Accessibility bounds GET /accessibility, slow on busy desktops.
	Accessibility time.Duration
	// Query bounds the small queries: /terminal, /screen_size,
	// /cursor_position.
	Query time.Duration
	// VerifySlack is added to the max_wait_time of an
	// execute_with_verification call to bound it.
	VerifySlack time.Duration
}

func (t Timeouts) withDefaults() Timeouts {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.Screenshot, DefaultScreenshotTimeout)
	def(&t.Execute, DefaultExecuteTimeout)
	def(&t.Launch, DefaultLaunchTimeout)
	def(&t.OpenFile, DefaultOpenFileTimeout)
	def(&t.Transfer, DefaultTransferTimeout)
	def(&t.Window, DefaultWindowTimeout)
	def(&t.Accessibility, DefaultAccessibilityTimeout)
	def(&t.Query, DefaultQueryTimeout)
	def(&t.VerifySlack, DefaultVerifySlack)
	return t
}

// Options configure a Client. The zero value is ready to use.
type Options struct {
	// HTTPClient sends the requests. Nil means a client of its own with no
	// overall timeout (per-call timeouts apply) and no proxy: the guest is
	// reached through a loopback forward, never through a proxy.
	HTTPClient *http.Client
	// Timeouts bound each kind of call.
	Timeouts Timeouts
	// Logger receives debug lines about calls; nil discards them.
	Logger *slog.Logger
}

// Client talks to one guest server. It is safe for concurrent use.
type Client struct {
	base     *url.URL
	http     *http.Client
	timeouts Timeouts
	log      *slog.Logger
}

// New returns a client for the guest server at baseURL, such as
// "http://127.0.0.1:40123".
func New(baseURL string, opts Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("guest: base URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("guest: base URL %q: want http://host:port", baseURL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	hc := opts.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		// A guest forward accepts a connection before the guest listens; a
		// short dial timeout keeps a dead forward from eating a whole call.
		tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		hc = &http.Client{Transport: tr}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{base: u, http: hc, timeouts: opts.Timeouts.withDefaults(), log: log}, nil
}

// URL returns the guest server's base URL.
func (c *Client) URL() string { return c.base.String() }

// CloseIdleConnections closes the client's idle connections to the guest,
// for when the guest goes away (a VM closed or reverted).
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Sentinel errors, matched with errors.Is on a returned error.
var (
	// ErrUnreachable means no answer came from the guest server.
	ErrUnreachable = errors.New("guest server unreachable")
	// ErrTimeout means the call's own timeout passed.
	ErrTimeout = errors.New("guest call timed out")
	// ErrNotFound means the guest answered 404 for the thing asked for (a
	// file, a window, a path), not that the endpoint is missing.
	ErrNotFound = errors.New("not found in guest")
	// ErrVerificationFailed means an execute_with_verification command ran
	// but its verification did not pass in time.
	ErrVerificationFailed = errors.New("verification failed")
	// ErrBadResponse means the guest answered 200 with a body that is not
	// what the API promises (not JSON, not a PNG).
	ErrBadResponse = errors.New("bad response from guest")
)

// Error is a failed call to the guest server.
type Error struct {
	// Op names the call: "screenshot", "execute", "setup/launch", ...
	Op string
	// URL is the endpoint called.
	URL string
	// Status is the HTTP status the guest answered, 0 if none came.
	Status int
	// Body is the start of the guest's answer, for the message.
	Body string
	// Err is the cause: a transport error (wrapped with ErrUnreachable or
	// ErrTimeout), the caller's ctx error, or a sentinel of this package.
	Err error

	raw []byte // the start of a failed answer, for callers that parse it
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "guest %s %s", e.Op, e.URL)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": status %d", e.Status)
	}
	if e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// IsNotReady reports whether err means the guest server did not answer at
// all (refused, reset, or silent until the call's timeout), as a guest that
// is still booting does, rather than answering with a failure.
func IsNotReady(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTimeout)
}

// How much of a failed answer an Error shows, and keeps for parsing.
const (
	maxErrorBody = 512
	maxErrorRaw  = 64 << 10
)

var errCallTimeout = errors.New("call timeout")

// request is one call to the guest.
type request struct {
	op      string
	method  string
	path    string
	timeout time.Duration
	body    io.Reader
	size    int64 // -1 when unknown
	ctype   string
}

// call is a request in flight whose answer was 2xx.
type call struct {
	resp    *http.Response
	cancel  context.CancelFunc
	ctx     context.Context // the caller's
	callCtx context.Context // the caller's, bounded by the call's timeout
	op, url string
	timeout time.Duration
}

// close releases the call.
func (cl *call) close() {
	cl.resp.Body.Close()
	cl.cancel()
}

// fail builds the error of a call that failed after its answer started.
func (cl *call) fail(err error) *Error {
	return &Error{Op: cl.op, URL: cl.url, Status: cl.resp.StatusCode, Err: err}
}

// do sends r. Any status other than 2xx is returned as an *Error; on success
// the caller reads the answer and closes the call.
func (c *Client) do(ctx context.Context, r request) (*call, error) {
	u := c.base.JoinPath(r.path).String()
	callCtx, cancel := context.WithTimeoutCause(ctx, r.timeout, errCallTimeout)
	req, err := http.NewRequestWithContext(callCtx, r.method, u, r.body)
	if err != nil {
		cancel()
		return nil, &Error{Op: r.op, URL: u, Err: err}
	}
	if r.body != nil {
		req.ContentLength = r.size
		req.Header.Set("Content-Type", r.ctype)
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, &Error{Op: r.op, URL: u, Err: classify(ctx, callCtx, err, r.timeout)}
	}
	c.log.Debug("guest call", "op", r.op, "status", resp.StatusCode, "seconds", time.Since(start).Seconds())
	cl := &call{resp: resp, cancel: cancel, ctx: ctx, callCtx: callCtx, op: r.op, url: u, timeout: r.timeout}
	if resp.StatusCode/100 != 2 {
		defer cl.close()
		body, rerr := io.ReadAll(io.LimitReader(resp.Body, maxErrorRaw))
		e := cl.fail(nil)
		e.raw = body
		e.Body = truncate(strings.TrimSpace(string(body)), maxErrorBody)
		switch {
		case rerr != nil:
			e.Err = classify(ctx, callCtx, rerr, r.timeout)
		case resp.StatusCode == http.StatusNotFound:
			e.Err = ErrNotFound
		}
		return nil, e
	}
	return cl, nil
}

// classify turns a transport error into one callers can branch on.
func classify(ctx, callCtx context.Context, err error, timeout time.Duration) error {
	if ctx.Err() != nil {
		// The caller gave up: say so, whatever the transport said.
		return fmt.Errorf("%w (%v)", context.Cause(ctx), err)
	}
	if errors.Is(context.Cause(callCtx), errCallTimeout) {
		return fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, ErrUnreachable)
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w: %w", ErrTimeout, ErrUnreachable, err)
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

// readAll reads a successful answer, at most limit bytes, and closes the
// call.
func (cl *call) readAll(limit int64) ([]byte, error) {
	defer cl.close()
	body, err := io.ReadAll(io.LimitReader(cl.resp.Body, limit+1))
	if err != nil {
		return nil, cl.fail(classify(cl.ctx, cl.callCtx, err, cl.timeout))
	}
	if int64(len(body)) > limit {
		return nil, cl.fail(fmt.Errorf("%w: answer larger than %d bytes", ErrBadResponse, limit))
	}
	return body, nil
}
