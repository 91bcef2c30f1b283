package view_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"legato/rl/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The fixture's screenshots: shotW×shotH of shotBG, with a lighter block
// in the bottom right corner whose place says the step, so that every
// step's screen is its own image.
const shotW, shotH = 640, 400

var (
	shotBG = color.RGBA{0x20, 0x30, 0x40, 0xff}
	marker = color.RGBA{0xff, 0x00, 0xff, 0xff} // the click marker's fill (view.css)
)

func screenshot(t *testing.T, n int) string {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, shotW, shotH))
	for y := range shotH {
		for x := range shotW {
			img.SetRGBA(x, y, shotBG)
		}
	}
	for y := shotH - 30; y < shotH-10; y++ {
		for x := shotW - 100 + 10*n; x < shotW-90+10*n && x < shotW; x++ {
			img.SetRGBA(x, y, color.RGBA{0xe0, 0xe0, 0xe0, 0xff})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// clickAt is the first step's click, on the 0–999 grid; on the 640×400
// screenshot it is at (clickX, clickY).
var (
	clickAt        = [2]float64{500, 250}
	clickX, clickY = 500 * 640 / 999.0, 250 * 400 / 999.0
)

// dragTo is where the fourth step's drag ends, on the grid; on the
// screenshot it is at (dragX, dragY).
var (
	dragTo       = [2]float64{800, 800}
	dragX, dragY = 800 * 640 / 999.0, 800 * 400 / 999.0
)

// reasoning is the first step's reasoning, which the attempt page shows.
const reasoning = "The Save button is in the toolbar at the top; I will click it."

func call(t *testing.T, v map[string]any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFixture writes a run of two groups: t-save's two attempts (the
// first clicks, types, presses keys, drags, scrolls, ends; the second
// fails) and t-other's one, quarantined.
func writeFixture(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	run, err := schema.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	if err := run.WriteBatch(&schema.Batch{Schema: schema.BatchVersion, Model: "qwen3-vl", Version: "v1", Group: 2, Attempts: 2,
		TaskIDs: []string{"t-save", "t-other"}, Harness: "qwen qwen3vl, image max 3"}); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	put := func(msgs ...schema.Message) []string {
		h, err := run.PutMessages(msgs)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	system := schema.Message{Role: "system", Content: []schema.Part{schema.TextPart("You use a computer.")}}
	type stepSpec struct {
		reasoning, content string
		call               map[string]any
		code               string
	}
	attempt := func(id, task, group string, n int, reward float64, specs []stepSpec) {
		var history []schema.Message
		history = append(history, system, schema.Message{Role: "user", Content: []schema.Part{schema.TextPart("Save the file " + task)}})
		rec := schema.Record{RolloutID: id, TaskID: task, Domain: "writer", GroupID: group, Attempt: n,
			Policy: schema.Policy{Model: "qwen3-vl", Version: "v1"}, Status: schema.StatusOK, Reward: &reward,
			StartedAt: schema.Time{Time: start}, EndedAt: schema.Time{Time: start.Add(time.Minute)},
			Env: &schema.EnvReport{Reset: "snapshot", ResetWhy: "the golden state was ready", Grading: []schema.MetricRun{{Metric: "compare_docx", Via: "native"}},
				UnsettledStart: id == "r-save-0"},
			Timing: schema.Timing{ResetS: 2, ModelS: 3, ActS: 1, TotalS: 8}}
		for k, s := range specs {
			history = append(history, schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(screenshot(t, k))}})
			ar := schema.ActionRecord{Action: s.code, ActS: 0.25, WaitS: 0.5, ReadyS: 0.125, ObsS: 0.0625, Unsettled: k == 1}
			if s.call != nil {
				ar.Call = call(t, s.call)
			}
			rec.Steps = append(rec.Steps, schema.Step{Request: put(history...), StartedAt: schema.Time{Time: start.Add(time.Duration(k) * time.Second)},
				Response: schema.Response{Reasoning: s.reasoning, Content: s.content, TokenIDs: []int64{1, 2, 3}, Logprobs: []float64{-0.5, -0.25, -1},
					TokenIDsSource: schema.SourceReturnTokenIDs, FinishReason: "stop"},
				Model:   schema.ModelCall{Seconds: 1.5, Attempts: 1, PromptTokens: 1200 + 300*k, CompletionTokens: 3, CachedTokens: new(1000)},
				Actions: []schema.ActionRecord{ar}})
			history = append(history, schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(s.content)}})
		}
		rec.NSteps = len(rec.Steps)
		if err := run.Append(&rec); err != nil {
			t.Fatal(err)
		}
	}
	attempt("r-save-0", "t-save", "v1/t-save", 0, 1, []stepSpec{
		{reasoning, "Clicking Save.", map[string]any{"action": "left_click", "coordinate": clickAt[:]},
			fmt.Sprintf("pyautogui.click(%d, %d)", int(clickAt[0]*1920/999), int(clickAt[1]*1080/999))},
		{"Now the name.", "Typing.", map[string]any{"action": "type", "text": "report.docx"}, "pyautogui.typewrite('report.docx')"},
		{"Confirm.", "Pressing keys.", map[string]any{"action": "key", "keys": []string{"ctrl", "s"}}, "pyautogui.hotkey('ctrl', 's')"},
		{"Drag the slider.", "Dragging.", map[string]any{"action": "left_click_drag", "coordinate": dragTo[:]}, "pyautogui.dragTo(1537, 864, duration=0.5)"},
		{"Scroll down.", "Scrolling.", map[string]any{"action": "scroll", "pixels": -5, "coordinate": []float64{200, 600}}, "pyautogui.scroll(-5, x=384, y=648)"},
		{"Done.", "Done.", map[string]any{"action": "terminate", "status": "success"}, "DONE"},
	})
	attempt("r-save-1", "t-save", "v1/t-save", 1, 0, []stepSpec{
		{"Maybe the menu.", "Right click.", map[string]any{"action": "right_click", "coordinate": []float64{100, 100}}, "pyautogui.rightClick(192, 108)"},
	})
	attempt("r-other-0", "t-other", "v1/t-other", 0, 0, []stepSpec{
		{"Hmm.", "Double click.", map[string]any{"action": "double_click", "coordinate": []float64{900, 900}}, "pyautogui.doubleClick(1729, 972)"},
	})
	if _, err := schema.AddQuarantined(filepath.Join(dir, schema.TaskQuarantineFile), map[string]schema.QuarantinedTask{
		"t-other": {TaskSHA: strings.Repeat("a", 64), Reason: schema.QuarantineGraderDisagrees, Evidence: "graded twice, two rewards"}}); err != nil {
		t.Fatal(err)
	}
	return dir
}
