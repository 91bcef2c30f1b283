package profile_test

import (
	"bytes"
	"fmt"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/export/profile"
	"legato/rl/internal/chromiumtest"
)

func writePage(t *testing.T) string {
	t.Helper()
	page := filepath.Join(t.TempDir(), "profile.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := profile.WriteHTML(f, build(t, fixedRun)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return page
}

// TestHTMLSelfContained checks that the page loads nothing: no URLs, no
// external scripts, styles, images or fonts.
func TestHTMLSelfContained(t *testing.T) {
	page, err := os.ReadFile(writePage(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"http:", "https:", "src=", "href=", "@import", "url(", "<script", "<link"} {
		if bytes.Contains(page, []byte(bad)) {
			t.Errorf("page contains %q; it must be self-contained", bad)
		}
	}
	if bytes.Contains(page, []byte("ZgotmplZ")) {
		t.Error("page contains ZgotmplZ: html/template rejected a value")
	}
}

// TestHTMLInChromium renders the page in headless Chromium and checks what
// it drew: the DOM has a row for every desktop with every attempt that ran,
// the histogram and its percentile marks, the status counts; the screenshot
// is not blank and shows every phase color.
func TestHTMLInChromium(t *testing.T) {
	bin := chromiumtest.Path(t)
	page := writePage(t)
	rep := build(t, fixedRun)

	dom := string(chromiumtest.Run(t, bin, "file://"+page, "--dump-dom"))
	var wantDesktops, gotDesktops []string
	for _, d := range rep.Desktops {
		wantDesktops = append(wantDesktops, fmt.Sprint(d.Slot))
	}
	for _, m := range regexp.MustCompile(`<g class="desktop-row" data-desktop="(\d+)"`).FindAllStringSubmatch(dom, -1) {
		gotDesktops = append(gotDesktops, m[1])
	}
	if diff := cmp.Diff(wantDesktops, gotDesktops); diff != "" {
		t.Errorf("desktop rows in the DOM (-want +got):\n%s", diff)
	}
	var gotRollouts []string
	for _, m := range regexp.MustCompile(`<g class="rollout" data-rollout="([^"]+)" data-status="([a-z]+)"`).FindAllStringSubmatch(dom, -1) {
		gotRollouts = append(gotRollouts, m[1]+" "+m[2])
	}
	slices.Sort(gotRollouts)
	wantRollouts := []string{"r-a0 ok", "r-a1 truncated", "r-a1-try0 retried", "r-a2 surplus", "r-b0 ok",
		"r-b1 ok", "r-b2 cancelled", "r-c0 error", "r-c1 ok", "r-c2 error"}
	if diff := cmp.Diff(wantRollouts, gotRollouts); diff != "" {
		t.Errorf("rollouts in the DOM (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		what string
		re   string
		want int
	}{
		{"histogram bins", `<rect class="bin"`, 30},
		{"percentile marks", `<g class="mark">`, 3},
		{"status counts", `<span class="status-count" data-status=`, 7},
		{"phase bars", `<g class="phase-bar">`, 10},
		{"prefix-cache hit rate", `id="cache-hit"[^>]*>prefix-cache hit rate<span class="n">11.0%`, 1},
	} {
		if got := len(regexp.MustCompile(c.re).FindAllString(dom, -1)); got != c.want {
			t.Errorf("%s: %d in the DOM, want %d", c.what, got, c.want)
		}
	}

	shot := filepath.Join(t.TempDir(), "profile.png")
	chromiumtest.Run(t, bin, "file://"+page, "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	colors, nonWhite := map[color.RGBA]int{}, 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			colors[c]++
			if c.R < 245 || c.G < 245 || c.B < 245 {
				nonWhite++
			}
		}
	}
	if share := float64(nonWhite) / float64(b.Dx()*b.Dy()); share < 0.05 || len(colors) < 20 {
		t.Errorf("screenshot looks blank: %.1f%% non-white pixels, %d colors", 100*share, len(colors))
	}
	// Every phase color is on screen: the timeline, the legend and the
	// share bars are drawn in them.
	for _, hex := range []string{"#8c6bb1", "#cbb8e6", "#f28e2b", "#4e79a7", "#59a14f", "#b5d99c", "#76b7b2", "#edc948", "#e15759"} {
		want := parseHex(hex)
		n := 0
		for c, k := range colors {
			if near(c, want) {
				n += k
			}
		}
		if n < 100 {
			t.Errorf("phase color %s: %d pixels in the screenshot, want at least 100", hex, n)
		}
	}
	if t.Failed() {
		keep := filepath.Join(os.TempDir(), "legato-profile-failed.png")
		if data, err := os.ReadFile(shot); err == nil && os.WriteFile(keep, data, 0o644) == nil {
			t.Logf("screenshot kept at %s", keep)
		}
	}
}

func parseHex(s string) color.RGBA {
	var c color.RGBA
	fmt.Sscanf(s, "#%02x%02x%02x", &c.R, &c.G, &c.B)
	c.A = 255
	return c
}

func near(a, b color.RGBA) bool {
	d := func(x, y uint8) int { return max(int(x)-int(y), int(y)-int(x)) }
	return d(a.R, b.R) <= 3 && d(a.G, b.G) <= 3 && d(a.B, b.B) <= 3
}
