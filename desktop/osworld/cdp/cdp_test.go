package cdp_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/cdp/cdptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTabs(t *testing.T) {
	ctx := context.Background()
	b := cdptest.New(t)
	c, err := cdp.New(b.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	conn, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	id, err := conn.OpenTab(ctx, "https://example.com/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.OpenTab(ctx, "https://example.org/"); err != nil {
		t.Fatal(err)
	}
	tabs, err := conn.Tabs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, tab := range tabs {
		urls = append(urls, tab.URL)
	}
	if diff := cmp.Diff([]string{"about:blank", "https://example.com/a", "https://example.org/"}, urls); diff != "" {
		t.Errorf("tabs (-want +got):\n%s", diff)
	}
	if err := conn.CloseTab(ctx, id); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"about:blank", "https://example.org/"}, b.TabURLs()); diff != "" {
		t.Errorf("after close (-want +got):\n%s", diff)
	}
	var ce *cdp.Error
	if err := conn.CloseTab(ctx, "nope"); !errors.As(err, &ce) || ce.Method != "Target.closeTarget" {
		t.Errorf("closing a missing tab: error = %v, want a *cdp.Error", err)
	}
}

func TestVersionNotReady(t *testing.T) {
	b := cdptest.New(t)
	b.NotReadyFor(1)
	c, _ := cdp.New(b.URL, nil)
	defer c.CloseIdleConnections()
	if _, err := c.Version(context.Background()); err == nil {
		t.Fatal("Version succeeded while the browser was starting")
	}
	v, err := c.Version(context.Background())
	if err != nil || v.Browser != "FakeChrome/1.0" {
		t.Fatalf("Version = %+v, %v", v, err)
	}
}

// TestSameURL's expectations are what OSWorld's compare_urls answered for
// each pair (Python 3.11, tldextract 3.1.2 with its bundled suffix list).
func TestSameURL(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"https://www.tripadvisor.com", "https://www.tripadvisor.com/", true},
		{"https://www.tripadvisor.com", "https://tripadvisor.com", true},
		{"HTTPS://Example.COM/x", "https://example.com/x", true},
		{"https://example.com/x", "https://example.com/x/", false},
		{"https://example.com/?q=1", "https://example.com/?q=2", false},
		{"http://example.com", "https://example.com", false},
		{"www.airbnb.com", "http://airbnb.com", true},
		{"https://www.airbnb.com.sg/rooms", "https://airbnb.com/rooms", true},
		{"https://www.airbnb.co.uk", "https://airbnb.com", true},
		{"https://example.com:8443/a", "https://example.com/a", true},
		{"https://user:pw@example.com/a", "https://example.com/a", true},
		{"https://maps.google.com", "https://google.com", false},
		{"https://www.maps.google.com", "https://maps.google.com", false},
		{"https://foo.blogspot.com", "https://bar.blogspot.com", false},
		{"file:///home/user/pages/one.html", "file:///home/user/pages/one.html", true},
		{"file:///home/user/pages/one.html", "file:///home/user/pages/two.html", false},
		{"http://127.0.0.1:8000/x", "http://127.0.0.1/x", true},
		{"http://localhost:8000/", "http://localhost", true},
		{"http://www.localhost/", "http://localhost", true},
		{"https://example.com/a;p?q#f", "https://example.com/a;p?q#f", true},
		{"https://example.com/a;p", "https://example.com/a;q", false},
		{"https://example.com/a#f", "https://example.com/a#g", false},
		{"https://example.com/a?", "https://example.com/a", true},
		{"chrome://newtab/", "chrome://newtab", true},
		{"about:blank", "http://about:blank", true},
		{"https://example.com/A", "https://example.com/a", false},
		{"  https://example.com/a", "https://example.com/a", false},
		{"https://exa\tmple.com/a", "https://example.com/a", true},
		{"https://sub.example.co.uk/x", "https://sub.example.com/x", true},
		{"https://www.www.example.com", "https://www.example.com", false},
		{"https://[::1]:8080/a", "https://[::1]/a", true},
		{"https://example.com/;p", "https://example.com;p", false},
		{"example.com/path", "https://example.com/path", false},
	}
	for _, tt := range tests {
		if got := cdp.SameURL(tt.a, tt.b); got != tt.want {
			t.Errorf("SameURL(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
