package fake_test

import (
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

// BenchmarkObserve measures a 1920×1080 screenshot: Changing renders and
// encodes a new frame on every call (the screen is settling), Stable returns
// the cached PNG of an unchanged screen.
func BenchmarkObserve(b *testing.B) {
	for _, bc := range []struct {
		name   string
		settle time.Duration
	}{
		{"Changing", time.Hour},
		{"Stable", 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := b.Context()
			d := fake.New(fake.Config{Latency: fake.Latencies{Settle: fake.Latency{Fixed: bc.settle}}})
			defer d.Close()
			task := desktop.Task{ID: "bench"}
			if err := d.Reset(ctx, task); err != nil {
				b.Fatal(err)
			}
			var size int
			b.ReportAllocs()
			for b.Loop() {
				obs, err := d.Observe(ctx)
				if err != nil {
					b.Fatal(err)
				}
				size = len(obs.Screenshot)
			}
			b.ReportMetric(float64(size), "png-bytes")
		})
	}
}
