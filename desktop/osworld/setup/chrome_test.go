package setup

import (
	"testing"
	"time"
)

// TestChromeTime: Chrome's history timestamps, checked against Python's
// int((t - datetime(1601, 1, 1)).total_seconds() * 1_000_000), OSWorld's
// formula.
func TestChromeTime(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), 11644473600000000},
		{time.Date(2026, 12, 4, 6, 58, 0, 0, time.UTC), 13440841080000000},
		{time.Date(2024, 2, 29, 12, 0, 0, 500_000_000, time.UTC), 13353681600500000},
		{time.Date(2024, 2, 29, 13, 0, 0, 500_000_000, time.FixedZone("CET", 3600)), 13353681600500000},
	} {
		if got := chromeTime(c.t); got != c.want {
			t.Errorf("chromeTime(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}
