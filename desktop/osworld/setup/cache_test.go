package setup_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/errgroup"

	"legato/rl/desktop/osworld/setup"
)

func TestCacheDownloadsOnce(t *testing.T) {
	var hits atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		<-release // hold the first download until every caller is waiting
		io.WriteString(w, "payload of "+r.URL.Path)
	}))
	defer srv.Close()
	cache, err := setup.NewCache(t.TempDir(), setup.CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := srv.URL + "/file.xlsx"
	g, ctx := errgroup.WithContext(context.Background())
	paths := make([]string, 8)
	for i := range paths {
		g.Go(func() error {
			p, err := cache.Fetch(ctx, u)
			paths[i] = p
			return err
		})
	}
	close(release)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := hits.Load(); got != 1 {
		t.Errorf("server saw %d downloads, want 1", got)
	}
	for _, p := range paths {
		if p != cache.Path(u) {
			t.Errorf("path %s, want %s", p, cache.Path(u))
		}
	}
	b, err := os.ReadFile(cache.Path(u))
	if err != nil || string(b) != "payload of /file.xlsx" {
		t.Errorf("cached file = %q, %v", b, err)
	}
	// A second cache on the same directory (another process) reuses it.
	other, _ := setup.NewCache(filepath.Dir(cache.Path(u)), setup.CacheOptions{})
	if _, err := other.Fetch(context.Background(), u); err != nil || hits.Load() != 1 {
		t.Errorf("second cache: %v, %d downloads", err, hits.Load())
	}
}

func TestCacheFailures(t *testing.T) {
	tests := []struct {
		name       string
		handler    func(n int32, w http.ResponseWriter)
		wantHits   int32
		wantStatus int
		wantOK     bool
	}{
		{"not found is not retried", func(n int32, w http.ResponseWriter) {
			w.WriteHeader(http.StatusNotFound)
		}, 1, 404, false},
		{"server error is retried", func(n int32, w http.ResponseWriter) {
			if n == 1 {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			io.WriteString(w, "ok")
		}, 2, 0, true},
		{"short body is retried, then an error", func(n int32, w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(100))
			io.WriteString(w, "only a part")
		}, 2, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tt.handler(hits.Add(1), w)
			}))
			defer srv.Close()
			dir := t.TempDir()
			cache, _ := setup.NewCache(dir, setup.CacheOptions{Attempts: 2})
			p, err := cache.Fetch(context.Background(), srv.URL+"/f")
			if (err == nil) != tt.wantOK {
				t.Fatalf("Fetch = %q, %v; want ok %v", p, err, tt.wantOK)
			}
			var de *setup.DownloadError
			if err != nil && (!errors.As(err, &de) || de.Status != tt.wantStatus) {
				t.Errorf("error %v, want a *DownloadError with status %d", err, tt.wantStatus)
			}
			if got := hits.Load(); got != tt.wantHits {
				t.Errorf("requests = %d, want %d", got, tt.wantHits)
			}
			if !tt.wantOK {
				// Nothing half-written is left behind to be mistaken for a file.
				entries, _ := os.ReadDir(dir)
				if len(entries) != 0 {
					t.Errorf("cache dir holds %d entries after a failure", len(entries))
				}
			}
		})
	}
	cache, _ := setup.NewCache(t.TempDir(), setup.CacheOptions{})
	if _, err := cache.Fetch(context.Background(), "file:///etc/passwd"); err == nil {
		t.Errorf("Fetch of a file: URL succeeded")
	}
}
