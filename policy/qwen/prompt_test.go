package qwen

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var goldenTask = desktop.Task{
	ID:          "demo",
	Domain:      "os",
	Instruction: `Rename the file "draft.txt" on the Desktop to "final.txt".`,
}

// scriptedReply is the model's reply at step n (from 1): every format, a
// reply that does not parse, and one whose calls the server parsed.
func scriptedReply(n int) policy.Reply {
	switch n {
	case 1:
		return policy.Reply{Content: "Action: Open the Files app from the dock.\n" + jsonCall(`{"action": "left_click", "coordinate": [30, 500]}`)}
	case 2:
		return policy.Reply{Content: "Action: Type the new name.\n" + xmlCall("action", "type", "text", "final.txt\n")}
	case 3:
		return policy.Reply{Content: "I am not sure what to do next."}
	case 4:
		return policy.Reply{Content: "Action: Save.", ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: `{"action": "key", "keys": ["ctrl", "s"]}`}}}
	case 5:
		return policy.Reply{Content: "<think>\nThe dialog is still open.\n</think>\n\nAction: Close the dialog.\n" + jsonCall(`{"action": "key", "keys": ["esc"]}`)}
	}
	return policy.Reply{Content: fmt.Sprintf("Action: Scroll down (step %d).\n", n) + jsonCall(`{"action": "scroll", "pixels": -3}`)}
}

// runEpisode plays n steps and returns the prompt of each, from step 1.
func runEpisode(t testing.TB, h *Harness, w, ht, n int) [][]schema.Message {
	t.Helper()
	ep := h.NewEpisode(goldenTask)
	var prompts [][]schema.Message
	for i := 1; i <= n; i++ {
		msgs, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, w, ht, uint64(i)), Width: w, Height: ht})
		if err != nil {
			t.Fatalf("step %d: Prompt: %v", i, err)
		}
		prompts = append(prompts, msgs)
		ep.Reply(scriptedReply(i))
	}
	return prompts
}

// goldenJSON renders messages for a golden file, each image replaced by
// its size and a short hash so the file stays small and readable.
func goldenJSON(t *testing.T, msgs []schema.Message) []byte {
	t.Helper()
	out := make([]schema.Message, len(msgs))
	for i, m := range msgs {
		out[i] = schema.Message{Role: m.Role}
		for _, p := range m.Content {
			if p.ImageURL != nil {
				data := decodeDataURL(t, p.ImageURL.URL)
				cfg, err := png.DecodeConfig(bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				sum := sha256.Sum256(data)
				p = schema.ImagePart(fmt.Sprintf("<png %dx%d sha256:%x>", cfg.Width, cfg.Height, sum[:6]))
			}
			out[i].Content = append(out[i].Content, p)
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got); go test -update rewrites it:\n%s", path, diff)
	}
}

func TestPromptGolden(t *testing.T) {
	prompts := runEpisode(t, New(Config{}), 320, 200, 21)
	for _, step := range []int{1, 2, 21} {
		t.Run(fmt.Sprintf("step %d", step), func(t *testing.T) {
			checkGolden(t, fmt.Sprintf("prompt_step%02d.golden.json", step), goldenJSON(t, prompts[step-1]))
		})
	}
	t.Run("qwen25vl step 2", func(t *testing.T) {
		prompts := runEpisode(t, New(Config{Style: Qwen25VL}), 320, 200, 2)
		checkGolden(t, "prompt_qwen25vl_step02.golden.json", goldenJSON(t, prompts[1]))
	})
}

// TestPromptExtendsPreviousPrompt proves the prefix-cache property: the
// request of step n+1 is the request of step n, byte for byte, plus the
// reply of step n and the screenshot of step n+1, except at the steps that
// evict: every step past ImageMax for EvictOldest, every ImageMax/2 steps
// for EvictHalf.
func TestPromptExtendsPreviousPrompt(t *testing.T) {
	const steps = 31
	tests := []struct {
		eviction Eviction
		// evicts are the steps whose prompt does not extend the one
		// before; shown the screenshots of the last step.
		evicts []int
		shown  int
	}{
		{EvictHalf, []int{21, 31}, 11},
		{EvictOldest, []int{21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}, DefaultImageMax},
	}
	for _, tt := range tests {
		t.Run(tt.eviction.String(), func(t *testing.T) {
			prompts := runEpisode(t, New(Config{Eviction: tt.eviction}), 160, 96, steps)
			var evicts []int
			for n := 1; n < steps; n++ {
				prev, next := prompts[n-1], prompts[n]
				prevJSON, err := json.Marshal(prev)
				if err != nil {
					t.Fatal(err)
				}
				nextJSON, err := json.Marshal(next)
				if err != nil {
					t.Fatal(err)
				}
				// The JSON array of step n, less its closing bracket, starts
				// the array of step n+1.
				if !bytes.HasPrefix(nextJSON, prevJSON[:len(prevJSON)-1]) {
					evicts = append(evicts, n+1)
					continue
				}
				if len(next) != len(prev)+2 {
					t.Fatalf("step %d has %d messages, want %d + 2", n+1, len(next), len(prev))
				}
				reply, obs := next[len(prev)], next[len(prev)+1]
				if reply.Role != "assistant" || len(reply.Content) != 1 || reply.Content[0].Text != historyText(scriptedReply(n)) {
					t.Errorf("step %d: message %d is %+v, want the reply of step %d verbatim", n+1, len(prev), reply, n)
				}
				if obs.Role != "user" || obs.Content[len(obs.Content)-1].ImageURL == nil {
					t.Errorf("step %d: last message is %+v, want the new screenshot", n+1, obs)
				}
			}
			if diff := cmp.Diff(tt.evicts, evicts); diff != "" {
				t.Errorf("steps whose prompt does not extend the previous one (-want +got):\n%s", diff)
			}
			last := prompts[steps-1]
			if got := countImages(last); got != tt.shown {
				t.Errorf("step %d carries %d screenshots, want %d", steps, got, tt.shown)
			}
			// The prompt changes at the first user message, which keeps
			// the task and shows the placeholder.
			first := last[1].Content
			if len(first) != 2 || first[1].Text != evictedText || !strings.Contains(first[0].Text, goldenTask.Instruction) {
				t.Errorf("step %d's first user message = %+v, want the task and the placeholder", steps, first)
			}
		})
	}
}

func countImages(msgs []schema.Message) int {
	n := 0
	for _, m := range msgs {
		for _, p := range m.Content {
			if p.ImageURL != nil {
				n++
			}
		}
	}
	return n
}

// TestPromptKeepsNewestImages checks eviction with a small ImageMax: every
// prompt carries the newest screenshots, as many as the eviction keeps.
func TestPromptKeepsNewestImages(t *testing.T) {
	const imageMax, steps = 4, 12
	tests := []struct {
		eviction Eviction
		shown    []int // screenshots per step
	}{
		{EvictOldest, []int{1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
		{EvictHalf, []int{1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.eviction.String(), func(t *testing.T) {
			h := New(Config{ImageMax: imageMax, Eviction: tt.eviction})
			ep := h.NewEpisode(goldenTask)
			var urls []string // each step's screenshot as the prompt first showed it
			for i := 1; i <= steps; i++ {
				msgs, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, uint64(i))})
				if err != nil {
					t.Fatal(err)
				}
				var shown []string
				for _, m := range msgs {
					for _, p := range m.Content {
						if p.ImageURL != nil {
							shown = append(shown, p.ImageURL.URL)
						}
					}
				}
				urls = append(urls, shown[len(shown)-1])
				want := urls[len(urls)-tt.shown[i-1]:]
				if diff := cmp.Diff(want, shown); diff != "" {
					t.Errorf("step %d: screenshots shown (-want +got):\n%s", i, truncate(diff, 500))
				}
				ep.Reply(scriptedReply(i))
			}
			e := ep.(*Episode)
			for i, s := range e.steps[:steps-tt.shown[steps-1]] {
				if s.image != "" {
					t.Errorf("step %d's evicted screenshot is still held in memory", i+1)
				}
			}
		})
	}
}

// TestSystemPromptOverride: a system prompt from the config is sent
// verbatim, and the rest of the prompt is as with the built-in one.
func TestSystemPromptOverride(t *testing.T) {
	const custom = "You are a GUI agent trained with this exact prompt.\nReply with <tool_call> blocks."
	for _, style := range []Style{Qwen3VL, Qwen25VL} {
		t.Run(style.String(), func(t *testing.T) {
			builtIn := runEpisode(t, New(Config{Style: style}), 320, 200, 2)
			own := runEpisode(t, New(Config{Style: style, SystemPrompt: custom}), 320, 200, 2)
			for i := range own {
				if got := own[i][0]; got.Role != "system" || len(got.Content) != 1 || got.Content[0].Text != custom {
					t.Errorf("step %d: system message %+v, want the custom prompt verbatim", i+1, got)
				}
				if diff := cmp.Diff(builtIn[i][1:], own[i][1:]); diff != "" {
					t.Errorf("step %d: the rest of the prompt changed (-built-in +custom):\n%s", i+1, truncate(diff, 500))
				}
			}
		})
	}
}

func TestPromptImage(t *testing.T) {
	// The size sent for each style and screen: Qwen3-VL sends a screenshot
	// the rule would only round to its grid as it is (the server rounds
	// it the same way); a real downscale, and every Qwen2.5-VL resize,
	// happen here, since Qwen2.5-VL coordinates are pixels of the sent
	// image.
	for _, tt := range []struct {
		name         string
		cfg          Config
		w, h         int
		wantW, wantH int
	}{
		{"qwen3 grid rounding only", Config{}, 640, 360, 640, 360},
		{"qwen3 downscale", Config{MaxPixels: 100_000}, 640, 360, 416, 224},
		{"qwen25 resize", Config{Style: Qwen25VL}, 640, 360, 644, 364},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ep := New(tt.cfg).NewEpisode(goldenTask)
			msgs, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, tt.w, tt.h, 1)})
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := png.DecodeConfig(bytes.NewReader(decodeDataURL(t, msgs[1].Content[1].ImageURL.URL)))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Width != tt.wantW || cfg.Height != tt.wantH {
				t.Errorf("sent image is %dx%d, want %dx%d", cfg.Width, cfg.Height, tt.wantW, tt.wantH)
			}
			if s := tt.cfg.Screen(tt.w, tt.h); tt.cfg.Style == Qwen25VL && (s.ImageWidth != tt.wantW || s.ImageHeight != tt.wantH) {
				t.Errorf("Qwen2.5-VL coordinates are for %dx%d, but the image sent is %dx%d", s.ImageWidth, s.ImageHeight, tt.wantW, tt.wantH)
			}
		})
	}
	t.Run("already the right size is sent as is", func(t *testing.T) {
		shot := desktopPNG(t, 640, 352, 1)
		ep := New(Config{}).NewEpisode(goldenTask)
		msgs, err := ep.Prompt(desktop.Observation{Screenshot: shot})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(decodeDataURL(t, msgs[1].Content[1].ImageURL.URL), shot) {
			t.Error("a screenshot already of the right size was re-encoded")
		}
	})
}

func TestPromptCoordinatesUseScreenSize(t *testing.T) {
	// A HiDPI-like observation: the PNG has 640×360 pixels, pyautogui's
	// screen is 1280×720.
	ep := New(Config{}).NewEpisode(goldenTask)
	if _, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 640, 360, 1), Width: 1280, Height: 720}); err != nil {
		t.Fatal(err)
	}
	got := ep.Reply(policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [500, 300]}`)})
	if got.Err != nil || len(got.Actions) != 1 || got.Actions[0].Code != "pyautogui.click(640, 216)" {
		t.Errorf("Reply = %+v, want pyautogui.click(640, 216)", got)
	}

	// Qwen25VL: 1280×720 is sent as 1288×728, and coordinates are pixels
	// of that.
	ep = New(Config{Style: Qwen25VL}).NewEpisode(goldenTask)
	if _, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 1280, 720, 1), Width: 1280, Height: 720}); err != nil {
		t.Fatal(err)
	}
	got = ep.Reply(policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [644, 364]}`)})
	if got.Err != nil || len(got.Actions) != 1 || got.Actions[0].Code != "pyautogui.click(640, 360)" {
		t.Errorf("Qwen25VL Reply = %+v, want pyautogui.click(640, 360)", got)
	}
}

func TestPromptRetryReplacesObservation(t *testing.T) {
	ep := New(Config{}).NewEpisode(goldenTask)
	first, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, 1)})
	if err != nil {
		t.Fatal(err)
	}
	// The model call failed; the worker observes again and asks again.
	second, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != len(first) {
		t.Fatalf("retry prompt has %d messages, want %d", len(second), len(first))
	}
	if second[1].Content[1].ImageURL.URL == first[1].Content[1].ImageURL.URL {
		t.Error("retry prompt still shows the first observation")
	}
}

func TestPromptReturnsFreshParts(t *testing.T) {
	ep := New(Config{}).NewEpisode(goldenTask)
	first, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, 1)})
	if err != nil {
		t.Fatal(err)
	}
	url := first[1].Content[1].ImageURL.URL
	first[1].Content[1].ImageURL.URL = schema.ImageScheme + "0000" // what a store does
	first[0].Content[0].Text = "changed"
	ep.Reply(scriptedReply(1))
	second, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if second[1].Content[1].ImageURL.URL != url || second[0].Content[0].Text == "changed" {
		t.Error("changing a returned prompt changed the episode's history")
	}
}

func TestPromptErrors(t *testing.T) {
	shot := desktopPNG(t, 160, 96, 1)
	tests := []struct {
		name    string
		cfg     Config
		task    desktop.Task
		obs     desktop.Observation
		wantErr string
	}{
		{"invalid config", Config{ImageMax: -2}, goldenTask, desktop.Observation{Screenshot: shot}, "image max -2"},
		{"no instruction", Config{}, desktop.Task{ID: "x"}, desktop.Observation{Screenshot: shot}, "no instruction"},
		{"no screenshot", Config{}, goldenTask, desktop.Observation{}, "no screenshot"},
		{"not a png", Config{}, goldenTask, desktop.Observation{Screenshot: []byte("GIF89a...")}, "not a PNG"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg).NewEpisode(tt.task).Prompt(tt.obs)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Prompt() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestReplyWithoutPrompt(t *testing.T) {
	ep := New(Config{}).NewEpisode(goldenTask)
	if got := ep.Reply(scriptedReply(1)); !errors.Is(got.Err, ErrNoPrompt) || len(got.Actions) != 0 {
		t.Errorf("Reply before Prompt = %+v, want ErrNoPrompt and no actions", got)
	}
	if _, err := ep.Prompt(desktop.Observation{Screenshot: desktopPNG(t, 160, 96, 1)}); err != nil {
		t.Fatal(err)
	}
	ep.Reply(scriptedReply(1))
	if got := ep.Reply(scriptedReply(2)); !errors.Is(got.Err, ErrNoPrompt) {
		t.Errorf("second Reply to one Prompt: Err = %v, want ErrNoPrompt", got.Err)
	}
}

func TestHistoryTextOfParsedToolCalls(t *testing.T) {
	got := historyText(policy.Reply{Content: "Action: Save.", ToolCalls: []policy.ToolCall{
		{Name: "computer_use", Arguments: `{"action": "key", "keys": ["ctrl", "s"]}`},
		{Name: "computer_use", Arguments: `not json <&>`},
	}})
	want := "Action: Save.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"key\", \"keys\": [\"ctrl\", \"s\"]}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"computer_use\", \"arguments\": \"not json <&>\"}\n</tool_call>"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("historyText (-want +got):\n%s", diff)
	}
}
