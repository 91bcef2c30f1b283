package view_test

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"legato/rl/export/view"
	"legato/rl/internal/benchrun"
)

// BenchmarkFirstPage measures `legato rl view` on a run of 2,000 attempts
// of 15 steps (internal/benchrun's synthetic run, 300,000 messages):
// the time from Open to the run's first page and to an attempt's page,
// and the heap in use once both are served.
//
//	go test -run '^$' -bench FirstPage -benchtime 3x ./export/view
func BenchmarkFirstPage(b *testing.B) {
	dir := b.TempDir()
	if err := (benchrun.Run{Rollouts: 2000, Steps: 15, Group: 8}).Write(dir); err != nil {
		b.Fatal(err)
	}
	var heap uint64
	var first, attempt time.Duration
	for b.Loop() {
		start := time.Now()
		run, err := view.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		h := view.Handler(run, token)
		for _, path := range []string{"/", "/attempt?id=r-01999"} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", path, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body.String())
			}
			if path == "/" {
				first += time.Since(start)
			} else {
				attempt += time.Since(start)
			}
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap = max(heap, ms.HeapInuse)
		runtime.KeepAlive(run)
		run.Close()
	}
	b.ReportMetric(float64(first.Milliseconds())/float64(b.N), "ms-to-first-page")
	b.ReportMetric(float64(attempt.Milliseconds())/float64(b.N), "ms-to-attempt-page")
	b.ReportMetric(float64(heap)/(1<<20), "MiB-heap-in-use")
}
