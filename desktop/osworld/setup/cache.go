package setup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"legato/rl/internal/backoff"
)

// DefaultDownloadAttempts is how many times Cache tries a download that
// fails transiently (network error, 429, 5xx).
const DefaultDownloadAttempts = 3

// downloadRetry is the wait before each further try of a download: 1 s,
// then doubling. The cap only matters to a cache told to try many times:
// a file server that keeps failing for minutes is better reported than
// waited for.
var downloadRetry = backoff.Policy{Base: time.Second, Max: time.Minute}

// Cache downloads task files on the host once per URL and keeps them, so
// that every attempt of every task reuses them. Files are named by the
// SHA-256 of their URL and appear atomically (written to a temporary file,
// then renamed), so several workers, and several legato processes, may
// share one directory. Its methods are safe for concurrent use.
type Cache struct {
	dir      string
	http     *http.Client
	log      *slog.Logger
	attempts int

	mu    sync.Mutex
	locks map[string]*urlLock
}

// urlLock serializes the downloads of one URL within the process.
type urlLock struct {
	ch    chan struct{}
	users int
}

// CacheOptions configure a Cache. The zero value is ready to use.
type CacheOptions struct {
	// HTTPClient downloads; nil means http.DefaultClient. Downloads are
	// bounded by the caller's ctx only: files can be large.
	HTTPClient *http.Client
	// Attempts is how many tries a transient failure gets; zero means
	// DefaultDownloadAttempts.
	Attempts int
	// Logger receives a line per download; nil discards them.
	Logger *slog.Logger
}

// NewCache returns a cache keeping its files in dir, which it creates.
func NewCache(dir string, opts CacheOptions) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("setup: download cache needs a directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("setup: download cache: %w", err)
	}
	c := &Cache{dir: dir, http: opts.HTTPClient, log: opts.Logger, attempts: opts.Attempts, locks: map[string]*urlLock{}}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.attempts <= 0 {
		c.attempts = DefaultDownloadAttempts
	}
	return c, nil
}

// Path returns where the file of rawURL is (or will be) kept.
func (c *Cache) Path(rawURL string) string {
	sum := sha256.Sum256([]byte(rawURL))
	return filepath.Join(c.dir, hex.EncodeToString(sum[:]))
}

// DownloadError is a download that failed.
type DownloadError struct {
	URL string
	// Status is the HTTP status answered, 0 if none.
	Status int
	Err    error
}

func (e *DownloadError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("download %s: status %d: %v", e.URL, e.Status, e.Err)
	}
	return fmt.Sprintf("download %s: %v", e.URL, e.Err)
}

func (e *DownloadError) Unwrap() error { return e.Err }

// transient reports whether trying again may help.
func (e *DownloadError) transient() bool {
	if e.Status != 0 {
		return e.Status == http.StatusTooManyRequests || e.Status >= 500
	}
	return !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) && !errors.Is(e.Err, errNotHTTP)
}

var errNotHTTP = errors.New("not an http(s) URL")

// Fetch returns the path of the cached file of rawURL, downloading it first
// if no one has yet.
func (c *Cache) Fetch(ctx context.Context, rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", &DownloadError{URL: rawURL, Err: errNotHTTP}
	}
	p := c.Path(rawURL)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	unlock, err := c.lock(ctx, rawURL)
	if err != nil {
		return "", &DownloadError{URL: rawURL, Err: err}
	}
	defer unlock()
	// Another caller may have finished it while this one waited.
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	var last *DownloadError
	for attempt := 1; attempt <= c.attempts; attempt++ {
		if attempt > 1 {
			wait := downloadRetry.Wait(attempt - 2)
			c.log.Info("retrying download", "url", rawURL, "attempt", attempt, "after", last)
			if err := backoff.Sleep(ctx, wait); err != nil {
				return "", &DownloadError{URL: rawURL, Err: fmt.Errorf("%w (after: %v)", err, last)}
			}
		}
		start := time.Now()
		n, err := c.download(ctx, rawURL, p)
		if err == nil {
			c.log.Info("downloaded", "url", rawURL, "bytes", n, "seconds", time.Since(start).Seconds())
			return p, nil
		}
		last = err
		if !err.transient() || ctx.Err() != nil {
			break
		}
	}
	return "", last
}

// lock takes the URL's lock, waiting at most until ctx is done.
func (c *Cache) lock(ctx context.Context, key string) (func(), error) {
	c.mu.Lock()
	l := c.locks[key]
	if l == nil {
		l = &urlLock{ch: make(chan struct{}, 1)}
		c.locks[key] = l
	}
	l.users++
	c.mu.Unlock()
	release := func() {
		c.mu.Lock()
		l.users--
		if l.users == 0 {
			delete(c.locks, key)
		}
		c.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// download writes rawURL's body to p through a temporary file.
func (c *Cache) download(ctx context.Context, rawURL, p string) (int64, *DownloadError) {
	fail := func(status int, err error) (int64, *DownloadError) {
		return 0, &DownloadError{URL: rawURL, Status: status, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return fail(0, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fail(0, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(resp.StatusCode, errors.New(http.StatusText(resp.StatusCode)))
	}
	tmp, err := os.CreateTemp(c.dir, ".download-*")
	if err != nil {
		return fail(0, err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	n, err := io.Copy(tmp, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("got %d of %d bytes", n, resp.ContentLength)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		return fail(0, err)
	}
	return n, nil
}
