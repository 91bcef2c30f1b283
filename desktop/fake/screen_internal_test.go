package fake

import (
	"bytes"
	"image"
	"image/png"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestPNGRoundTrip decodes the hand-assembled PNG with image/png and
// compares every pixel with the frame that was drawn.
func TestPNGRoundTrip(t *testing.T) {
	for _, size := range []image.Point{{1920, 1080}, {33, 47}, {640, 400}} {
		s := newScreen(size.X, size.Y)
		for _, f := range []frame{{task: 1, history: 2}, {task: 1, history: 2, settling: true, tick: 3}, {task: 9, history: 5}} {
			img, err := s.png(f)
			if err != nil {
				t.Fatal(err)
			}
			m, err := png.Decode(bytes.NewReader(img))
			if err != nil {
				t.Fatalf("%v %+v: decode: %v", size, f, err)
			}
			got, ok := m.(*image.Paletted)
			if !ok {
				t.Fatalf("%v %+v: decoded a %T, want *image.Paletted", size, f, m)
			}
			if got.Bounds() != s.img.Bounds() {
				t.Fatalf("%v %+v: bounds %v, want %v", size, f, got.Bounds(), s.img.Bounds())
			}
			if len(got.Palette) != len(s.img.Palette) {
				t.Errorf("%v %+v: %d palette entries, want %d", size, f, len(got.Palette), len(s.img.Palette))
			}
			for y := range size.Y {
				w := s.img.Pix[s.img.PixOffset(0, y):][:size.X]
				g := got.Pix[got.PixOffset(0, y):][:size.X]
				if bytes.Equal(w, g) {
					continue
				}
				if diff := cmp.Diff(w, g); diff != "" {
					t.Fatalf("%v %+v: row %d (-drawn +decoded):\n%s", size, f, y, diff)
				}
			}
		}
	}
}
