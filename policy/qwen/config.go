package qwen

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Style is the coordinate and image convention of a Qwen model family.
type Style int

const (
	// Qwen3VL is the convention of Qwen3-VL and later (Qwen3.5): images
	// resized to multiples of 32 pixels, coordinates on a 0–999 grid over
	// the screenshot whatever its size. It is the zero value.
	Qwen3VL Style = iota
	// Qwen25VL is the convention of Qwen2.5-VL: images resized to multiples
	// of 28 pixels, coordinates in pixels of the resized screenshot.
	Qwen25VL
)

// String returns the name used in flags and configs: "qwen3vl" or
// "qwen25vl".
func (s Style) String() string {
	switch s {
	case Qwen3VL:
		return "qwen3vl"
	case Qwen25VL:
		return "qwen25vl"
	}
	return fmt.Sprintf("Style(%d)", int(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s Style) MarshalText() ([]byte, error) {
	if !s.valid() {
		return nil, fmt.Errorf("qwen: unknown style %d", int(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, so a Style can be a
// flag or a config field. It accepts "qwen3vl" and "qwen25vl" (also spelled
// "qwen3-vl", "qwen2.5-vl", ...), case-insensitively.
func (s *Style) UnmarshalText(text []byte) error {
	name := strings.ToLower(string(text))
	name = strings.NewReplacer("-", "", "_", "", ".", "", " ", "").Replace(name)
	switch name {
	case "qwen3vl", "qwen3", "qwen35":
		*s = Qwen3VL
	case "qwen25vl", "qwen25":
		*s = Qwen25VL
	default:
		return fmt.Errorf("qwen: unknown style %q: use qwen3vl (0-999 grid) or qwen25vl (pixels of the resized screenshot)", text)
	}
	return nil
}

func (s Style) valid() bool { return s == Qwen3VL || s == Qwen25VL }

// Factor is the side in pixels that resized screenshots are multiples of:
// the vision encoder's patch size times its 2×2 merge (32 for Qwen3VL, 28
// for Qwen25VL).
func (s Style) Factor() int {
	if s == Qwen25VL {
		return 28
	}
	return 32
}

// DefaultPixels returns the default bounds on the pixel count of a resized
// screenshot. The minimum is Qwen's (4 patches of Factor²); the maximum is
// what OSWorld's agent for the style used: 12800 patches of 32² for
// Qwen3VL (a 1920×1080 screen keeps its size, rounded to 1920×1088), 1280
// patches of 28² for Qwen25VL (1920×1080 becomes 1316×728).
func (s Style) DefaultPixels() (minPixels, maxPixels int) {
	f := s.Factor()
	if s == Qwen25VL {
		return 4 * f * f, 1280 * f * f
	}
	return 4 * f * f, 12800 * f * f
}

// Families lists the model families a harness can be made for, by the
// names NewFamily and the CLI's --harness take.
func Families() []string { return []string{Qwen3VL.String(), Qwen25VL.String()} }

// NewFamily returns the harness for the model family named family
// ("qwen3vl" or "qwen25vl", see Style.UnmarshalText), configured by cfg
// with its Style set to the family's. Unlike New it fails, naming the
// problem, on an unknown family or an invalid cfg.
func NewFamily(family string, cfg Config) (*Harness, error) {
	if err := cfg.Style.UnmarshalText([]byte(family)); err != nil {
		return nil, fmt.Errorf("harness %q: want one of %s", family, strings.Join(Families(), ", "))
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return New(cfg), nil
}

// DefaultImageMax is the default number of screenshots kept in a prompt.
const DefaultImageMax = 20

// Eviction says which screenshots leave the prompt once more than ImageMax
// exist. Evicted screenshots are replaced by a text placeholder.
type Eviction int

const (
	// EvictHalf drops the oldest half of the screenshots shown (ImageMax/2
	// of them, at least one) when a new one would make more than ImageMax.
	// Between two evictions every prompt extends the previous one, so the
	// server's prefix cache serves the whole history; only every
	// ImageMax/2 steps does the prompt change near its start. Prompts then
	// carry from ImageMax/2+1 to ImageMax screenshots. The default.
	EvictHalf Eviction = iota
	// EvictOldest keeps exactly the newest ImageMax screenshots: past
	// ImageMax every step drops one, so every prompt differs from the one
	// before from its oldest screenshot on, and the prefix cache serves
	// only what comes before that.
	EvictOldest
)

// String returns the name used in flags and configs: "half" or "oldest".
func (e Eviction) String() string {
	switch e {
	case EvictHalf:
		return "half"
	case EvictOldest:
		return "oldest"
	}
	return fmt.Sprintf("Eviction(%d)", int(e))
}

// MarshalText names the eviction as UnmarshalText reads it.
func (e Eviction) MarshalText() ([]byte, error) {
	if e != EvictHalf && e != EvictOldest {
		return nil, fmt.Errorf("qwen: unknown eviction %d", int(e))
	}
	return []byte(e.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler: "half" or "oldest".
func (e *Eviction) UnmarshalText(text []byte) error {
	switch strings.ToLower(string(text)) {
	case "half":
		*e = EvictHalf
	case "oldest":
		*e = EvictOldest
	default:
		return fmt.Errorf("qwen: unknown eviction %q: use half (keeps the prefix cache) or oldest (keeps the most screenshots)", text)
	}
	return nil
}

// Config configures the harness. The zero value is the default: Qwen3-VL
// conventions, the built-in system prompt, and at most 20 screenshots per
// prompt, evicted half at a time.
type Config struct {
	// ImageMax is the most screenshots a prompt carries, the newest ones;
	// older ones are replaced by a text placeholder, as Eviction says. 0
	// means DefaultImageMax.
	ImageMax int
	// Eviction says how screenshots leave a prompt past ImageMax; the zero
	// value is EvictHalf.
	Eviction Eviction
	// Style picks the coordinate and image convention; the zero value is
	// Qwen3VL.
	Style Style
	// MinPixels and MaxPixels bound the pixel count of a resized
	// screenshot; 0 means the style's default (Style.DefaultPixels).
	MinPixels, MaxPixels int
	// SystemPrompt, when set, is the system message of every prompt,
	// verbatim, instead of the built-in one: the prompt the model was
	// trained with. Replies are still parsed as the package comment says
	// (computer_use calls in <tool_call> blocks, the XML function style or
	// OpenAI tool calls), so the prompt should ask for one of those, with
	// coordinates in the Style's convention.
	SystemPrompt string
}

// withDefaults returns c with its zero values replaced by defaults.
func (c Config) withDefaults() Config {
	if c.ImageMax == 0 {
		c.ImageMax = DefaultImageMax
	}
	lo, hi := c.Style.DefaultPixels()
	if c.MinPixels == 0 {
		c.MinPixels = lo
	}
	if c.MaxPixels == 0 {
		c.MaxPixels = hi
	}
	return c
}

// Validate reports whether c can be used, and if not, what to change.
func (c Config) Validate() error {
	if !c.Style.valid() {
		return fmt.Errorf("qwen config: unknown style %d: use Qwen3VL or Qwen25VL", int(c.Style))
	}
	if c.ImageMax < 0 {
		return fmt.Errorf("qwen config: image max %d: must be at least 1 (or 0 for the default %d)", c.ImageMax, DefaultImageMax)
	}
	if c.Eviction != EvictHalf && c.Eviction != EvictOldest {
		return fmt.Errorf("qwen config: unknown eviction %d: use EvictHalf or EvictOldest", int(c.Eviction))
	}
	if c.SystemPrompt != "" && strings.TrimSpace(c.SystemPrompt) == "" {
		return errors.New("qwen config: the system prompt is only white space: give the prompt text, or leave it empty for the built-in one")
	}
	if !utf8.ValidString(c.SystemPrompt) {
		return errors.New("qwen config: the system prompt is not valid UTF-8: save the file as UTF-8")
	}
	if c.MinPixels < 0 || c.MaxPixels < 0 {
		return fmt.Errorf("qwen config: min pixels %d, max pixels %d: must not be negative (0 means the style's default)", c.MinPixels, c.MaxPixels)
	}
	d := c.withDefaults()
	f := c.Style.Factor()
	if d.MaxPixels < f*f {
		return fmt.Errorf("qwen config: max pixels %d: must be at least %d (one %d×%d patch)", d.MaxPixels, f*f, f, f)
	}
	if d.MinPixels > d.MaxPixels {
		return fmt.Errorf("qwen config: min pixels %d is above max pixels %d", d.MinPixels, d.MaxPixels)
	}
	return nil
}

// Screen returns how coordinates of a model using c map onto a screen of
// width×height pixels.
func (c Config) Screen(width, height int) Screen {
	d := c.withDefaults()
	h, w := SmartResize(height, width, d.Style.Factor(), d.MinPixels, d.MaxPixels)
	return Screen{Width: width, Height: height, Style: d.Style, ImageWidth: w, ImageHeight: h}
}

// Screen is a real screen and the screenshot the model saw of it: what is
// needed to map a model's coordinates back to the screen.
type Screen struct {
	// Width and Height are the real screen's size in pixels, as pyautogui
	// in the guest sees it.
	Width, Height int
	// Style says what the model's coordinates are.
	Style Style
	// ImageWidth and ImageHeight are the size of the resized screenshot;
	// Qwen25VL coordinates are pixels of it.
	ImageWidth, ImageHeight int
}

func (s Screen) validate() error {
	if s.Width <= 0 || s.Height <= 0 {
		return fmt.Errorf("qwen: screen %d×%d: width and height must be positive", s.Width, s.Height)
	}
	if !s.Style.valid() {
		return fmt.Errorf("qwen: screen: unknown style %d", int(s.Style))
	}
	if s.Style == Qwen25VL && (s.ImageWidth <= 0 || s.ImageHeight <= 0) {
		return fmt.Errorf("qwen: screen: image size %d×%d: Qwen25VL coordinates need the resized screenshot's size", s.ImageWidth, s.ImageHeight)
	}
	return nil
}

// SmartResize returns the size Qwen's vision preprocessing gives an image of
// height×width: both sides multiples of factor, as close to the original as
// rounding allows, scaled down (keeping the aspect ratio) when the pixel
// count would exceed maxPixels and up when it would fall below minPixels.
// Rounding matches Qwen's Python: halves round to even. Sides are never
// below factor. It returns 0, 0 when height, width or factor is not
// positive.
func SmartResize(height, width, factor, minPixels, maxPixels int) (h, w int) {
	if height <= 0 || width <= 0 || factor <= 0 {
		return 0, 0
	}
	f := float64(factor)
	h = max(factor, int(math.RoundToEven(float64(height)/f))*factor)
	w = max(factor, int(math.RoundToEven(float64(width)/f))*factor)
	switch area := float64(height) * float64(width); {
	case h*w > maxPixels:
		beta := math.Sqrt(area / float64(maxPixels))
		h = max(factor, int(math.Floor(float64(height)/beta/f))*factor)
		w = max(factor, int(math.Floor(float64(width)/beta/f))*factor)
	case h*w < minPixels:
		beta := math.Sqrt(float64(minPixels) / area)
		h = int(math.Ceil(float64(height)*beta/f)) * factor
		w = int(math.Ceil(float64(width)*beta/f)) * factor
	}
	return h, w
}
