package fake

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"math/rand/v2"

	"github.com/klauspost/compress/zlib"
)

// frame says what one screenshot shows. Equal frames are equal images.
type frame struct {
	// task hashes the task ID: it picks the background, so that every
	// attempt at a task starts from the same screen, as on a real VM.
	task uint64
	// history hashes the task ID and the Code actions since Reset: it
	// picks the colours of the window's cells.
	history uint64
	// settling is set while the screen is still changing; tick then
	// advances a progress bar on every Observe.
	settling bool
	tick     int
	// target is a target task's target (TargetFunc), drawn on a plain
	// screen instead of the window of cells; clicked says the attempt
	// clicked, at click, and hit that the click was inside the target.
	target  image.Rectangle
	clicked bool
	click   image.Point
	hit     bool
}

// Layout of the screen, in fractions of its size: a top bar, a window of
// gridCols×gridRows cells whose colours follow the action history, and a
// progress bar under the window while the screen settles. Mostly flat, like
// a desktop, so that it compresses well.
const (
	gridCols  = 16
	gridRows  = 9
	barTicks  = 16 // positions of the progress bar; consecutive ticks differ
	topBarIdx = 1  // palette indexes (palette.Plan9)
	barOnIdx  = 200
	barOffIdx = 20
)

// screens lends screens to the desktops of a fleet (or to one desktop made
// by New). A 1920×1080 screen's buffers and compressor take megabytes: with
// one per desktop, thousands of desktops held gigabytes and rendered all at
// once, which starved a batch of CPU and made a cancelled one take tens of
// seconds to wind down. So a fleet renders at most GOMAXPROCS screenshots
// at a time, and a caller waiting for a screen gives up when its ctx is
// done.
type screens struct {
	w, h int
	// free holds the screens not lent, nil for one not made yet.
	free chan *screen
}

func newScreens(w, h, n int) *screens {
	p := &screens{w: w, h: h, free: make(chan *screen, n)}
	for range n {
		p.free <- nil
	}
	return p
}

// get takes a screen, waiting for one while ctx lets it.
func (p *screens) get(ctx context.Context) (*screen, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case s := <-p.free:
		if s == nil {
			s = newScreen(p.w, p.h)
		}
		return s, nil
	}
}

// put gives back a screen that get lent.
func (p *screens) put(s *screen) { p.free <- s }

// screen renders frames into one reused buffer and encodes them with one
// reused compressor. It is lent to one Observe at a time by screens.
type screen struct {
	// img draws into raw, the PNG's uncompressed image data: each row is
	// a filter-type byte (0, none) followed by the row's palette indexes,
	// so a frame is compressed without copying it first.
	img *image.Paletted
	raw []byte
	// plte is the PNG palette chunk's data.
	plte []byte
	zw   *zlib.Writer
	z    bytes.Buffer // compressed raw
	out  bytes.Buffer
	bg   uint8 // background index the image was last filled with; 0 when new
	// last is the frame encoded in lastPNG.
	last    frame
	lastPNG []byte
}

func newScreen(w, h int) *screen {
	raw := make([]byte, h*(w+1))
	s := &screen{
		raw: raw,
		img: &image.Paletted{Pix: raw[1:], Stride: w + 1, Rect: image.Rect(0, 0, w, h), Palette: palette.Plan9},
	}
	for _, c := range palette.Plan9 {
		r, g, b, _ := c.RGBA()
		s.plte = append(s.plte, byte(r>>8), byte(g>>8), byte(b>>8))
	}
	// Level 1 of klauspost's zlib compresses a mostly flat 1920×1080
	// frame several times faster than image/png at png.BestSpeed, and the
	// frame is no larger. The error is nil for a valid level.
	s.zw, _ = zlib.NewWriterLevel(&s.z, zlib.BestSpeed)
	return s
}

// png returns the PNG of f; the caller owns the returned slice.
func (s *screen) png(f frame) ([]byte, error) {
	if s.lastPNG != nil && f == s.last {
		return bytes.Clone(s.lastPNG), nil
	}
	s.render(f)
	if err := s.encode(); err != nil {
		return nil, fmt.Errorf("encode png: %w", err)
	}
	s.last = f
	s.lastPNG = bytes.Clone(s.out.Bytes())
	return bytes.Clone(s.lastPNG), nil
}

// encode writes the PNG of raw into out: an 8-bit paletted, non-interlaced
// image (PNG specification, sections 5 and 11).
func (s *screen) encode() error {
	s.z.Reset()
	s.zw.Reset(&s.z)
	if _, err := s.zw.Write(s.raw); err != nil {
		return err
	}
	if err := s.zw.Close(); err != nil {
		return err
	}
	b := s.img.Bounds()
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(b.Dx()))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(b.Dy()))
	ihdr[8] = 8 // bit depth
	ihdr[9] = 3 // colour type: palette indexes
	// Compression, filter and interlace methods stay 0.

	s.out.Reset()
	s.out.WriteString("\x89PNG\r\n\x1a\n")
	writeChunk(&s.out, "IHDR", ihdr[:])
	writeChunk(&s.out, "PLTE", s.plte)
	writeChunk(&s.out, "IDAT", s.z.Bytes())
	writeChunk(&s.out, "IEND", nil)
	return nil
}

// writeChunk writes a PNG chunk: length, type, data, CRC of type and data.
func writeChunk(w *bytes.Buffer, typ string, data []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(data)))
	w.Write(n[:])
	w.WriteString(typ)
	w.Write(data)
	crc := crc32.NewIEEE()
	crc.Write([]byte(typ))
	crc.Write(data)
	binary.BigEndian.PutUint32(n[:], crc.Sum32())
	w.Write(n[:])
}

// Palette indexes of a target task's screen: a plain grey desktop, a red
// target that turns green when the first click hits it, and a white mark
// where that click was.
var (
	targetBgIdx   = uint8(color.Palette(palette.Plan9).Index(color.RGBA{0x60, 0x60, 0x60, 0xff}))
	targetIdx     = uint8(color.Palette(palette.Plan9).Index(color.RGBA{0xff, 0x00, 0x00, 0xff}))
	targetHitIdx  = uint8(color.Palette(palette.Plan9).Index(color.RGBA{0x00, 0xcc, 0x00, 0xff}))
	targetMarkIdx = uint8(color.Palette(palette.Plan9).Index(color.RGBA{0xff, 0xff, 0xff, 0xff}))
)

func (s *screen) render(f frame) {
	if !f.target.Empty() {
		s.renderTarget(f)
		return
	}
	b := s.img.Bounds()
	w, h := b.Dx(), b.Dy()
	// Indexes 32..223 keep clear of the near-black and near-white ends of
	// the palette, so neighbouring regions stay distinguishable.
	if bg := uint8(32 + f.task%192); bg != s.bg {
		s.fillBackground(bg)
	}
	s.fill(image.Rect(0, 0, w, h/36+1), topBarIdx)

	win := image.Rect(w/8, h/8, w-w/8, h-h/4)
	cells := rand.New(rand.NewPCG(f.history, mix(f.history)))
	for r := range gridRows {
		for c := range gridCols {
			cell := image.Rect(
				win.Min.X+c*win.Dx()/gridCols, win.Min.Y+r*win.Dy()/gridRows,
				win.Min.X+(c+1)*win.Dx()/gridCols, win.Min.Y+(r+1)*win.Dy()/gridRows,
			)
			s.fill(cell, uint8(cells.UintN(256)))
		}
	}

	if !f.settling {
		s.fill(progressBar(w, h), s.bg)
		return
	}
	s.progress(f.tick)
}

// progressBar is where the progress bar of a settling screen is: under the
// window of cells.
func progressBar(w, h int) image.Rectangle {
	return image.Rect(w/8, h-h/6, w-w/8, h-h/6+h/54+1)
}

// progress draws the progress bar at tick.
func (s *screen) progress(tick int) {
	b := s.img.Bounds()
	bar := progressBar(b.Dx(), b.Dy())
	lit := bar.Dx() * (tick%barTicks + 1) / barTicks
	s.fill(image.Rect(bar.Min.X, bar.Min.Y, bar.Min.X+lit, bar.Max.Y), barOnIdx)
	s.fill(image.Rect(bar.Min.X+lit, bar.Min.Y, bar.Max.X, bar.Max.Y), barOffIdx)
}

// renderTarget draws a target task's screen: the background, the top bar,
// the progress bar while the screen settles, the target, and the mark of
// the first click. The whole screen is painted again, so nothing of the
// last frame's target is left.
func (s *screen) renderTarget(f frame) {
	b := s.img.Bounds()
	w, h := b.Dx(), b.Dy()
	s.fillBackground(targetBgIdx)
	s.fill(image.Rect(0, 0, w, h/36+1), topBarIdx)
	if f.settling {
		s.progress(f.tick)
	}
	idx := targetIdx
	if f.hit {
		idx = targetHitIdx
	}
	s.fill(f.target, idx)
	if f.clicked {
		r := max(w, h) / 120
		s.fill(image.Rect(f.click.X-r, f.click.Y-r, f.click.X+r+1, f.click.Y+r+1), targetMarkIdx)
	}
	// The target is not background: the next frame of another task must
	// paint its own (no background index is 0).
	s.bg = 0
}

func (s *screen) fillBackground(idx uint8) {
	s.bg = idx
	s.fill(s.img.Bounds(), idx)
}

// fill paints r with one palette index: the first row by hand, the others
// by copying it, which is about as fast as memory allows.
func (s *screen) fill(r image.Rectangle, idx uint8) {
	r = r.Intersect(s.img.Bounds())
	if r.Empty() {
		return
	}
	first := s.img.Pix[s.img.PixOffset(r.Min.X, r.Min.Y):][:r.Dx()]
	for i := range first {
		first[i] = idx
	}
	for y := r.Min.Y + 1; y < r.Max.Y; y++ {
		copy(s.img.Pix[s.img.PixOffset(r.Min.X, y):][:r.Dx()], first)
	}
}
