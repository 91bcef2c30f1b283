package view_test

import (
	"bytes"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"legato/rl/export/view"
	"legato/rl/internal/chromiumtest"
)

var readmeShot = flag.String("readme-shot", "", "write the attempt page's screenshot to `FILE` (docs/view-attempt.png)")

func screenshotOf(t *testing.T, bin, url string) (image.Image, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shot.png")
	runChromium(t, bin, url, "--screenshot="+path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	return img, data
}

func near(a color.Color, b color.RGBA, tol int) bool {
	c := color.RGBAModel.Convert(a).(color.RGBA)
	d := func(x, y uint8) int { return max(int(x)-int(y), int(y)-int(x)) }
	return d(c.R, b.R) <= tol && d(c.G, b.G) <= tol && d(c.B, b.B) <= tol
}

// screenRect finds the fixture's screenshot as drawn on the page: the
// rows holding a long run of its background colour (the step strip's
// thumbnails are too narrow to count), from the run's start to its end.
func screenRect(img image.Image) image.Rectangle {
	b := img.Bounds()
	var r image.Rectangle
	found := false
	for y := b.Min.Y; y < b.Max.Y; y++ {
		x0, best0, best1 := -1, 0, 0
		for x := b.Min.X; x <= b.Max.X; x++ {
			if x < b.Max.X && near(img.At(x, y), shotBG, 6) {
				if x0 < 0 {
					x0 = x
				}
				continue
			}
			if x0 >= 0 && x-x0 > best1-best0 {
				best0, best1 = x0, x
			}
			x0 = -1
		}
		if best1-best0 < 300 {
			continue
		}
		row := image.Rect(best0, y, best1, y+1)
		if !found {
			r, found = row, true
		} else {
			r = r.Union(row)
		}
	}
	return r
}

// checkAttemptShot checks a screenshot of the first attempt's first step:
// the fixture's screenshot is drawn, with the click marker at the recorded
// coordinate scaled to the size it is drawn at, and not at the mirrored
// point.
func checkAttemptShot(t *testing.T, img image.Image) {
	t.Helper()
	r := screenRect(img)
	if r.Dx() < 300 {
		t.Fatalf("the screenshot of the step is not on the page (background run %v)", r)
	}
	// The drawn rectangle keeps the screenshot's aspect (a few pixels of
	// rounding, and the right edge may end under the marker's row).
	if got, want := float64(r.Dy())/float64(r.Dx()), float64(shotH)/shotW; got < want*0.97 || got > want*1.03 {
		t.Errorf("screenshot drawn as %v: aspect %.3f, want %.3f", r, got, want)
	}
	sx, sy := float64(r.Dx())/shotW, float64(r.Dy())/shotH
	at := image.Pt(r.Min.X+int(clickX*sx+0.5), r.Min.Y+int(clickY*sy+0.5))
	if c := img.At(at.X, at.Y); !near(c, marker, 24) {
		t.Errorf("pixel at the click %v (recorded %.1f,%.1f on %dx%d, drawn at %v): %v, want the marker %v", at, clickX, clickY, shotW, shotH, r, c, marker)
	}
	mirror := image.Pt(r.Max.X-int(clickX*sx), r.Max.Y-int(clickY*sy))
	if c := img.At(mirror.X, mirror.Y); !near(c, shotBG, 6) {
		t.Errorf("pixel at the mirrored point %v: %v, want the background %v", mirror, c, shotBG)
	}
}

// TestAttemptPageInChromium renders the pages of the fixture run in
// headless Chromium, served over loopback and exported as files opened
// from file://: the attempt page shows the step's screenshot with the click
// marker at the recorded coordinate (a pixel check on a screenshot of the
// page) and the model's text; the run and group pages show their
// attempts.
func TestAttemptPageInChromium(t *testing.T) {
	bin := chromiumtest.Path(t)
	dir := writeFixture(t)
	run := openRun(t, dir)
	srv := httptest.NewServer(view.Handler(run, token))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "pages")
	st, err := view.WriteStatic(run, out)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages != 1+2+3 || st.Images != 6 {
		t.Errorf("static export: %+v, want 6 pages (run, 2 groups, 3 attempts) and 6 images: the first screens are one image", st)
	}
	for _, c := range []struct{ name, attempt, run, group string }{
		{"served", srv.URL + "/attempt?id=r-save-0&token=" + token, srv.URL + "/?token=" + token, srv.URL + "/group?id=v1%2Ft-save&token=" + token},
		{"file", "file://" + filepath.Join(out, "a-r-save-0.html"), "file://" + filepath.Join(out, "index.html"), "file://" + filepath.Join(out, "g-"+fileNameOf(t, out, "g-v1_t-save"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			dom := string(runChromium(t, bin, c.attempt, "--dump-dom"))
			for _, want := range []string{reasoning, "Clicking Save.", "type: report.docx", "key: ctrl+s", "reset: <b>snapshot</b>", "compare_docx", "unsettled"} {
				if !strings.Contains(dom, strings.ReplaceAll(want, "'", "&#39;")) {
					t.Errorf("attempt page: %q not in the DOM", want)
				}
			}
			click := regexp.MustCompile(`<g class="m" data-kind="click" data-x="([0-9.]+)" data-y="([0-9.]+)">`).FindStringSubmatch(dom)
			if click == nil || click[1] != fmt.Sprint(round2(clickX)) || click[2] != fmt.Sprint(round2(clickY)) {
				t.Errorf("click mark in the DOM: %q, want at %v,%v", click, round2(clickX), round2(clickY))
			}
			for _, kind := range []string{"drag", "scroll"} {
				if !strings.Contains(dom, `data-kind="`+kind+`"`) {
					t.Errorf("no %s mark in the DOM", kind)
				}
			}
			img, data := screenshotOf(t, bin, c.attempt)
			checkAttemptShot(t, img)
			if t.Failed() {
				keep := filepath.Join(os.TempDir(), "legato-view-failed.png")
				if os.WriteFile(keep, data, 0o644) == nil {
					t.Logf("screenshot kept at %s", keep)
				}
			}
			if *readmeShot != "" && c.name == "file" {
				if err := os.WriteFile(*readmeShot, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}

			if c.name == "file" {
				// A deep link shows its step: step 3's drag ends at its
				// point, and step 0's click is not drawn.
				img, data = screenshotOf(t, bin, c.attempt+"#step-3")
				r := screenRect(img)
				sx, sy := float64(r.Dx())/shotW, float64(r.Dy())/shotH
				drag := image.Pt(r.Min.X+int(dragX*sx+0.5), r.Min.Y+int(dragY*sy+0.5))
				click := image.Pt(r.Min.X+int(clickX*sx+0.5), r.Min.Y+int(clickY*sy+0.5))
				if r.Dx() < 300 || !near(img.At(drag.X, drag.Y), marker, 24) || near(img.At(click.X, click.Y), marker, 24) {
					t.Errorf("#step-3: screenshot drawn at %v; pixel at the drag's end %v: %v, at step 0's click %v: %v; want the marker at the drag only",
						r, drag, img.At(drag.X, drag.Y), click, img.At(click.X, click.Y))
					os.WriteFile(filepath.Join(os.TempDir(), "legato-view-failed-step3.png"), data, 0o644)
				}
			}

			dom = string(runChromium(t, bin, c.run, "--dump-dom"))
			for _, id := range []string{"r-save-0", "r-save-1", "r-other-0"} {
				if !strings.Contains(dom, `data-rollout="`+id+`"`) {
					t.Errorf("run page: %s not listed", id)
				}
			}
			if !strings.Contains(dom, `id="success"`) || !strings.Contains(dom, "33.3%") {
				t.Errorf("run page: no success rate of 33.3%%")
			}
			dom = string(runChromium(t, bin, c.group, "--dump-dom"))
			for _, want := range []string{`data-rollout="r-save-0"`, `data-rollout="r-save-1"`, "advantage +1.000", "advantage -1.000", "Every attempt started from the same screen"} {
				if !strings.Contains(dom, want) {
					t.Errorf("group page: %q not in the DOM", want)
				}
			}
		})
	}
}

func round2(v float64) float64 { return float64(int(v*100+0.5)) / 100 }

// fileNameOf finds the page whose name starts with prefix in out.
func fileNameOf(t *testing.T, out, prefix string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(out, prefix+"*.html"))
	if len(m) != 1 {
		t.Fatalf("pages %s*.html in the export: %q, want one", prefix, m)
	}
	return strings.TrimPrefix(filepath.Base(m[0]), "g-")
}

// runChromium is chromiumtest.Run at one device pixel per CSS pixel (the
// pixel check measures the drawn image), after the page's script ran.
func runChromium(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	return chromiumtest.Run(t, bin, url, append([]string{"--force-device-scale-factor=1",
		"--virtual-time-budget=10000", "--run-all-compositor-stages-before-draw"}, extra...)...)
}
