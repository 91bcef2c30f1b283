package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// screenshot draws a deterministic desktop-like image: a wallpaper
// gradient, a top bar, windows with title bars and lines of "text", and a
// photo-like noisy patch, so PNG sizes resemble real screenshots.
func screenshot(w, h int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		c := color.RGBA{uint8(40 + 60*y/h), uint8(20 + 40*y/h), uint8(90 + 80*y/h), 255}
		for x := range w {
			img.SetRGBA(x, y, c)
		}
	}
	fill := func(x0, y0, x1, y1 int, c color.RGBA) {
		for y := max(y0, 0); y < min(y1, h); y++ {
			for x := max(x0, 0); x < min(x1, w); x++ {
				img.SetRGBA(x, y, c)
			}
		}
	}
	fill(0, 0, w, max(h/40, 2), color.RGBA{30, 30, 30, 255})
	for range 2 + rng.IntN(3) {
		x0, y0 := rng.IntN(w/2), h/40+rng.IntN(h/3)
		x1, y1 := x0+w/4+rng.IntN(w/2), y0+h/4+rng.IntN(h/2)
		fill(x0, y0, x1, y1, color.RGBA{245, 245, 245, 255})
		fill(x0, y0, x1, y0+max(h/36, 2), color.RGBA{60, 60, 70, 255})
		// Lines of words: runs of dark pixels with gaps.
		line := max(h/60, 3)
		for y := y0 + 2*line; y+line < y1; y += 2 * line {
			for x := x0 + line; x < x1-line; {
				word := line/2 + rng.IntN(6*line)
				fill(x, y, min(x+word, x1-line), y+line*2/3, color.RGBA{20, 20, 20, 255})
				x += word + line/2
			}
		}
	}
	px, py := rng.IntN(w*3/4), rng.IntN(h*3/4)
	for y := py; y < min(py+h/6, h); y++ {
		for x := px; x < min(px+w/6, w); x++ {
			v := uint8(rng.IntN(256))
			img.SetRGBA(x, y, color.RGBA{v, v / 2, 255 - v, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// withTextChunk returns a copy of a PNG with a tEXt chunk before IEND: the
// same picture as a different file, so every benchmark step stores a new
// image without drawing one.
func withTextChunk(p []byte, text string) []byte {
	iend := len(p) - 12 // IEND is the last chunk: length, type, CRC
	data := append([]byte("legato\x00"), text...)
	var chunk bytes.Buffer
	binary.Write(&chunk, binary.BigEndian, uint32(len(data)))
	chunk.WriteString("tEXt")
	chunk.Write(data)
	binary.Write(&chunk, binary.BigEndian, crc32.ChecksumIEEE(chunk.Bytes()[4:]))
	out := append([]byte(nil), p[:iend]...)
	out = append(out, chunk.Bytes()...)
	return append(out, p[iend:]...)
}

func dataURL(p []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(p) }

// systemPrompt stands in for a harness's system prompt with its tool schema.
var systemPrompt = "You control a computer through the computer_use tool. " + strings.Repeat("Describe the action precisely. ", 100)

// prompt builds the prompt of step k of a Qwen-style rollout: system,
// instruction, then per earlier step its screenshot and the reply, then the
// current screenshot. Only the newest imageMax screenshots are kept.
func prompt(shots []string, replies []string, k, imageMax int) []Message {
	msgs := []Message{
		{Role: "system", Content: []Part{TextPart(systemPrompt)}},
		{Role: "user", Content: []Part{TextPart("Open the spreadsheet on the desktop and sum column B.")}},
	}
	firstImage := max(0, k+1-imageMax)
	for j := 0; j <= k; j++ {
		user := Message{Role: "user", Content: []Part{TextPart(fmt.Sprintf("Screenshot after step %d.", j))}}
		if j >= firstImage {
			user.Content = append(user.Content, ImagePart(shots[j]))
		}
		msgs = append(msgs, user)
		if j < k {
			msgs = append(msgs, Message{Role: "assistant", Content: []Part{TextPart(replies[j])}})
		}
	}
	return msgs
}

func reply(j int) string {
	return fmt.Sprintf(`I will click the cell B%d.
<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [%d, %d]}}</tool_call>`, j+2, 100+7*j, 200+11*j)
}

// tinyPNG is a 1×1 PNG, fixed bytes so golden files do not depend on the
// PNG encoder.
var tinyPNG, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 125_000_000, time.UTC)

// fullRecord has every field set.
func fullRecord(id string) *Record {
	return &Record{
		Schema:    Version,
		RolloutID: id,
		TaskID:    "bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
		Domain:    "chrome",
		GroupID:   "v7/bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
		Attempt:   2,
		Policy:    Policy{Model: "qwen3-vl-8b", Version: "v7"},
		Status:    StatusOK,
		Reward:    ptr(1.0),
		Error:     &ErrorInfo{Kind: ErrorEnv, Message: "previous try: guest server did not answer"},
		NSteps:    2,
		Timing: Timing{ResetS: 4.5, WaitAfterResetS: 2.25, QueueS: 0.5, ModelS: 3.75, ActS: 0.25,
			WaitS: 1.5, ObsS: 0.125, WaitBeforeEvalS: 1, EvalS: 0.75, TotalS: 15},
		Steps: []Step{{
			Request:   []string{strings.Repeat("ab", 32), strings.Repeat("cd", 32)},
			StartedAt: Time{t0.Add(7 * time.Second)},
			Response: Response{
				Content:      `<tool_call>{"name":"computer_use","arguments":{"action":"left_click","coordinate":[500,300]}}</tool_call>`,
				Reasoning:    "The search box is at the top.",
				TokenIDs:     []int64{151657, 198, 4913},
				Logprobs:     []float64{-0.015625, -1.5, -0.25},
				Tokens:       []string{"<tool_call>", "\n", "{\""},
				FinishReason: "stop",
			},
			Model: ModelCall{Seconds: 1.75, QueueS: 0.25, Attempts: 2, PromptTokens: 2048, CompletionTokens: 3, CachedTokens: new(1024)},
			Actions: []ActionRecord{{
				Action: "import pyautogui; pyautogui.click(960, 324)",
				Call:   json.RawMessage(`{"action":"left_click","coordinate":[500,300]}`),
				ActS:   0.25, WaitS: 1.5, ReadyS: 1.25, ObsS: 0.125,
			}},
			ParseError: "second tool_call: unexpected end of JSON input",
			Warnings:   []string{"logprobs_token_ids_mismatch"},
		}, {
			Request:   []string{strings.Repeat("ef", 32)},
			StartedAt: Time{t0.Add(10 * time.Second)},
			Response:  Response{Content: "DONE", FinishReason: "stop"},
			Model:     ModelCall{Seconds: 2, Attempts: 1, PromptTokens: 2100, CompletionTokens: 1, CachedTokens: new(2048)},
			Actions:   []ActionRecord{{Action: "DONE"}},
		}},
		Desktop:   3,
		StartedAt: Time{t0},
		EndedAt:   Time{t0.Add(15 * time.Second)},
	}
}

// dirBytes sums the sizes of the regular files in dir.
func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// names lists the file names in dir.
func names(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func mustCreate(t testing.TB, dir string) *Run {
	t.Helper()
	r, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func readAll(t testing.TB, dir string) ([]Record, ReadStats) {
	t.Helper()
	var recs []Record
	st, err := ReadRunRecords(dir, func(r Record) error { recs = append(recs, r); return nil })
	if err != nil {
		t.Fatal(err)
	}
	return recs, st
}

func storeBytes(t testing.TB, dir string) int64 {
	return dirBytes(t, filepath.Join(dir, MessagesDir)) + dirBytes(t, filepath.Join(dir, ImagesDir))
}
