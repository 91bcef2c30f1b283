package qwen

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"

	"golang.org/x/image/draw"
)

// pngDataURLPrefix starts every image URL the harness sends.
const pngDataURLPrefix = "data:image/png;base64,"

// screenshotURL returns the data URL sent for a screenshot whose header is
// cfg. In the Qwen3-VL style a screenshot that the smart-resize rule would
// only round to the 32-pixel grid (1920×1080 → 1920×1088) is sent as it
// is: coordinates are on the 0–999 grid whatever the image size, and the
// server's image processor applies the same rule, so the model sees the
// same pixels while the worker skips a decode, a scale and an encode, which
// were nine tenths of a step's CPU. Qwen2.5-VL coordinates are pixels of
// the resized image, so there it is always resized here.
func screenshotURL(data []byte, cfg image.Config, s Screen) (string, error) {
	if s.Style == Qwen3VL && roundsOnly(cfg.Width, s.ImageWidth, s.Style.Factor()) && roundsOnly(cfg.Height, s.ImageHeight, s.Style.Factor()) {
		return dataURL(data), nil
	}
	return resizedDataURL(data, s.ImageWidth, s.ImageHeight)
}

// roundsOnly reports whether resizing a side from n to m pixels only rounds
// it to the factor's grid.
func roundsOnly(n, m, factor int) bool {
	d := n - m
	return -factor < d && d < factor
}

// resizedDataURL returns the screenshot data (a PNG) resized to w×h, as a
// data URL. A screenshot already of that size is sent as it is.
func resizedDataURL(data []byte, w, h int) (string, error) {
	return resize(data, w, h, draw.ApproxBiLinear)
}

// resize is resizedDataURL with the interpolator as a parameter, for
// BenchmarkResize. Approximate bilinear is several times faster than
// Catmull-Rom and close enough for a vision encoder, which sees the image
// at this very size; the benchmark measures both.
func resize(data []byte, w, h int, interp draw.Interpolator) (string, error) {
	cfg, err := pngConfig(data)
	if err != nil {
		return "", err
	}
	if cfg.Width == w && cfg.Height == h {
		return dataURL(data), nil
	}
	src, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("decode screenshot: %w", err)
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	interp.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
	var buf bytes.Buffer
	buf.Grow(len(data))
	// Speed over size: the PNG is encoded on the worker's critical path,
	// once per step, and its size matters little next to the image tokens
	// it becomes.
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, dst); err != nil {
		return "", fmt.Errorf("encode screenshot: %w", err)
	}
	return dataURL(buf.Bytes()), nil
}

// maxScreenshotPixels bounds the screenshots the harness decodes (a 64
// megapixel screen), so a corrupt header cannot make it allocate gigabytes.
const maxScreenshotPixels = 8192 * 8192

// pngConfig reads a screenshot's header.
func pngConfig(data []byte) (image.Config, error) {
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return cfg, fmt.Errorf("screenshot is not a PNG: %w", err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width > maxScreenshotPixels/cfg.Height {
		return cfg, fmt.Errorf("screenshot of %dx%d pixels: want 1 to %d pixels", cfg.Width, cfg.Height, maxScreenshotPixels)
	}
	return cfg, nil
}

// dataURL returns a PNG as a base64 data URL.
func dataURL(pngData []byte) string {
	b := make([]byte, len(pngDataURLPrefix)+base64.StdEncoding.EncodedLen(len(pngData)))
	n := copy(b, pngDataURLPrefix)
	base64.StdEncoding.Encode(b[n:], pngData)
	return string(b)
}
