package qwen

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"strings"
	"testing"
)

// desktopPNG draws a deterministic stand-in for a desktop screenshot: a
// gradient wallpaper, a few windows with title bars, and rows of dark
// glyph-sized marks for text. Seeds give different screens.
func desktopPNG(t testing.TB, w, h int, seed uint64) []byte {
	return drawDesktop(t, w, h, seed, false)
}

// photoDesktopPNG is desktopPNG on a grainy wallpaper, which compresses
// about as badly as a photo: the bulky end of real screenshots.
func photoDesktopPNG(t testing.TB, w, h int, seed uint64) []byte {
	return drawDesktop(t, w, h, seed, true)
}

func drawDesktop(t testing.TB, w, h int, seed uint64, grain bool) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		row := img.Pix[y*img.Stride : y*img.Stride+4*w]
		for x := range w {
			var n uint8
			if grain {
				n = uint8(rng.IntN(24))
			}
			copy(row[4*x:], []byte{uint8(40+60*y/h) + n, uint8(30+40*x/w) + n, uint8(90+80*y/h) + n, 255})
		}
	}
	fill := func(r image.Rectangle, c color.RGBA) {
		r = r.Intersect(img.Bounds())
		px := []byte{c.R, c.G, c.B, c.A}
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				copy(img.Pix[y*img.Stride+4*x:], px)
			}
		}
	}
	for range 3 {
		x0, y0 := rng.IntN(max(1, w/2)), rng.IntN(max(1, h/2))
		ww, wh := w/4+rng.IntN(max(1, w/3)), h/4+rng.IntN(max(1, h/3))
		fill(image.Rect(x0, y0, x0+ww, y0+wh), color.RGBA{245, 245, 245, 255})
		fill(image.Rect(x0, y0, x0+ww, y0+h/40+4), color.RGBA{60, 60, 70, 255})
		for line := y0 + h/40 + 12; line < y0+wh-12; line += 18 {
			for x := x0 + 10; x < x0+ww-10; x += 7 + rng.IntN(3) {
				if rng.IntN(6) == 0 {
					x += 6 // a space
					continue
				}
				fill(image.Rect(x, line, x+4+rng.IntN(2), line+8+rng.IntN(3)), color.RGBA{20, 20, 20, 255})
			}
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decodeDataURL returns the PNG inside a data URL the harness built.
func decodeDataURL(t testing.TB, url string) []byte {
	t.Helper()
	b64, ok := strings.CutPrefix(url, pngDataURLPrefix)
	if !ok {
		t.Fatalf("image URL %q does not start with %q", truncate(url, 40), pngDataURLPrefix)
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("image URL: %v", err)
	}
	return data
}
