package qwen

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSmartResize(t *testing.T) {
	q3min, q3max := Qwen3VL.DefaultPixels()
	q25min, q25max := Qwen25VL.DefaultPixels()
	tests := []struct {
		name                          string
		height, width, factor, lo, hi int
		wantH, wantW                  int
	}{
		{"qwen3vl 1080p rounds up 1080", 1080, 1920, 32, q3min, q3max, 1088, 1920},
		{"qwen3vl 720p rounds half to even", 720, 1280, 32, q3min, q3max, 704, 1280},
		{"qwen3vl exact multiple", 1024, 768, 32, q3min, q3max, 1024, 768},
		{"qwen25vl 1080p shrinks", 1080, 1920, 28, q25min, q25max, 728, 1316},
		{"qwen25vl small keeps", 280, 420, 28, q25min, q25max, 280, 420},
		{"tiny grows to min pixels", 10, 10, 28, 56 * 56, q25max, 56, 56},
		{"sides never below factor", 5, 4000, 32, 0, 4000*32 - 1, 32, 10112},
		{"not positive", 0, 100, 32, q3min, q3max, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, w := SmartResize(tt.height, tt.width, tt.factor, tt.lo, tt.hi)
			if diff := cmp.Diff([2]int{tt.wantH, tt.wantW}, [2]int{h, w}); diff != "" {
				t.Errorf("SmartResize(%d, %d, %d, %d, %d) (-want +got):\n%s", tt.height, tt.width, tt.factor, tt.lo, tt.hi, diff)
			}
		})
	}
}

// TestSmartResizeMatchesPython checks SmartResize against the same rule in
// Python, whose float division and half-to-even rounding the Qwen
// preprocessing uses, over a grid of sizes with both styles' defaults.
func TestSmartResizeMatchesPython(t *testing.T) {
	var cases [][5]int
	for _, s := range []Style{Qwen3VL, Qwen25VL} {
		lo, hi := s.DefaultPixels()
		for h := 1; h <= 4500; h += 53 {
			for w := 1; w <= 6000; w += 71 {
				cases = append(cases, [5]int{h, w, s.Factor(), lo, hi})
			}
		}
		// Halves, where rounding modes differ.
		for k := 1; k < 80; k++ {
			cases = append(cases, [5]int{k*s.Factor() + s.Factor()/2, 1000, s.Factor(), lo, hi})
		}
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(t), filepath.Join("testdata", "smart_resize.py"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("smart_resize.py: %v: %s", err, stderr.String())
	}
	var want [][2]int
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(cases) {
		t.Fatalf("python answered %d cases, want %d", len(want), len(cases))
	}
	bad := 0
	for i, c := range cases {
		h, w := SmartResize(c[0], c[1], c[2], c[3], c[4])
		if got := [2]int{h, w}; got != want[i] {
			if bad++; bad <= 10 {
				t.Errorf("SmartResize%v = %v, python says %v", c, got, want[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d sizes differ from Python", bad, len(cases))
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" means valid
	}{
		{"zero value", Config{}, ""},
		{"qwen25vl", Config{Style: Qwen25VL, ImageMax: 5}, ""},
		{"explicit pixels", Config{MinPixels: 1024, MaxPixels: 1 << 20}, ""},
		{"negative image max", Config{ImageMax: -1}, "image max -1"},
		{"unknown style", Config{Style: 7}, "unknown style 7"},
		{"negative pixels", Config{MinPixels: -5}, "must not be negative"},
		{"max below one patch", Config{MaxPixels: 100}, "max pixels 100"},
		{"min above max", Config{MinPixels: 1 << 24, MaxPixels: 1 << 20}, "is above max pixels"},
		{"oldest eviction", Config{Eviction: EvictOldest}, ""},
		{"unknown eviction", Config{Eviction: 9}, "unknown eviction 9"},
		{"custom system prompt", Config{SystemPrompt: "Operate the desktop."}, ""},
		{"blank system prompt", Config{SystemPrompt: " \n\t"}, "only white space"},
		{"system prompt not UTF-8", Config{SystemPrompt: "caf\xe9"}, "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	got := New(Config{Style: Qwen25VL}).Config()
	want := Config{ImageMax: 20, Style: Qwen25VL, MinPixels: 3136, MaxPixels: 1003520}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("New(Config{Style: Qwen25VL}).Config() (-want +got):\n%s", diff)
	}
	got = New(Config{}).Config()
	want = Config{ImageMax: 20, Style: Qwen3VL, MinPixels: 4096, MaxPixels: 13107200}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("New(Config{}).Config() (-want +got):\n%s", diff)
	}
}

func TestStyleText(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Style
	}{
		{"qwen3vl", Qwen3VL}, {"Qwen3-VL", Qwen3VL}, {"qwen3.5", Qwen3VL},
		{"qwen25vl", Qwen25VL}, {"Qwen2.5-VL", Qwen25VL},
	} {
		var s Style
		if err := s.UnmarshalText([]byte(tt.in)); err != nil || s != tt.want {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", tt.in, s, err, tt.want)
		}
		text, err := s.MarshalText()
		var back Style
		if err != nil || back.UnmarshalText(text) != nil || back != s {
			t.Errorf("round trip of %v through %q failed: %v", s, text, err)
		}
	}
	var s Style
	if err := s.UnmarshalText([]byte("llava")); err == nil {
		t.Error(`UnmarshalText("llava") = nil, want an error`)
	}
	if _, err := Style(9).MarshalText(); err == nil {
		t.Error("Style(9).MarshalText() = nil error, want one")
	}
}

func TestScreen(t *testing.T) {
	got := Config{Style: Qwen25VL}.Screen(1920, 1080)
	want := Screen{Width: 1920, Height: 1080, Style: Qwen25VL, ImageWidth: 1316, ImageHeight: 728}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Screen(1920, 1080) (-want +got):\n%s", diff)
	}
	if _, err := (Call{Action: ActionLeftClick, Coordinate: []float64{1, 1}}).Pyautogui(Screen{}); err == nil || errors.Is(err, ErrOutOfRange) {
		t.Errorf("Pyautogui on a zero Screen = %v, want a screen error", err)
	}
}

func TestNewFamily(t *testing.T) {
	tests := []struct {
		family       string
		cfg          Config
		wantStyle    Style
		wantImageMax int
		wantErr      string
	}{
		{"qwen3vl", Config{}, Qwen3VL, DefaultImageMax, ""},
		{"qwen25vl", Config{Style: Qwen3VL, ImageMax: 5}, Qwen25VL, 5, ""},
		{"Qwen2.5-VL", Config{}, Qwen25VL, DefaultImageMax, ""},
		{"llava", Config{}, 0, 0, `harness "llava": want one of qwen3vl, qwen25vl`},
		{"qwen3vl", Config{ImageMax: -1}, 0, 0, "image max -1"},
	}
	for _, tt := range tests {
		t.Run(tt.family, func(t *testing.T) {
			h, err := NewFamily(tt.family, tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || h != nil {
					t.Errorf("NewFamily(%q) = %v, %v; want an error containing %q", tt.family, h, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Config(); got.Style != tt.wantStyle || got.ImageMax != tt.wantImageMax {
				t.Errorf("NewFamily(%q) config %+v, want style %v and image max %d", tt.family, got, tt.wantStyle, tt.wantImageMax)
			}
		})
	}
	for _, f := range Families() {
		if _, err := NewFamily(f, Config{}); err != nil {
			t.Errorf("listed family %q: %v", f, err)
		}
	}
}

func TestEvictionText(t *testing.T) {
	for _, e := range []Eviction{EvictHalf, EvictOldest} {
		var got Eviction
		if err := got.UnmarshalText([]byte(e.String())); err != nil || got != e {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", e, got, err, e)
		}
	}
	var e Eviction
	if err := e.UnmarshalText([]byte("newest")); err == nil || !strings.Contains(err.Error(), "use half") {
		t.Errorf("UnmarshalText(newest) = %v, want an error naming the choices", err)
	}
}
