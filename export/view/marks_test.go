package view

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/schema"
)

// TestMarkAction checks the marks of each kind of action on a 640×400
// screenshot, from the parsed call (grid and pixel coordinates) and from
// pyautogui code alone, and that a drag starts where the pointer was.
func TestMarkAction(t *testing.T) {
	js := func(s string) json.RawMessage { return json.RawMessage(s) }
	for _, c := range []struct {
		name   string
		a      schema.ActionRecord
		coords string
		ptr    pointer
		want   []Mark
	}{
		{"click on the grid", schema.ActionRecord{Call: js(`{"action":"left_click","coordinate":[999,499.5]}`)}, gridCoords, pointer{},
			[]Mark{{Kind: "click", At: true, X: 640, Y: 200}}},
		{"click in pixels", schema.ActionRecord{Call: js(`{"action":"double_click","coordinate":[10,20]}`)}, pixelCoords, pointer{},
			[]Mark{{Kind: "double", At: true, X: 10, Y: 20}}},
		{"click where the pointer is", schema.ActionRecord{Call: js(`{"action":"right_click"}`)}, gridCoords, pointer{true, 5, 6},
			[]Mark{{Kind: "right", At: true, X: 5, Y: 6}}},
		{"drag from the pointer", schema.ActionRecord{Call: js(`{"action":"left_click_drag","coordinate":[0,999]}`)}, gridCoords, pointer{true, 5, 6},
			[]Mark{{Kind: "drag", At: true, X: 0, Y: 400, From: true, X0: 5, Y0: 6}}},
		{"scroll down", schema.ActionRecord{Call: js(`{"action":"scroll","pixels":-3}`)}, gridCoords, pointer{},
			[]Mark{{Kind: "scroll", At: true, X: 320, Y: 200, DY: 1, Caption: "scroll -3"}}},
		{"type", schema.ActionRecord{Call: js(`{"action":"type","text":"hi"}`)}, gridCoords, pointer{}, []Mark{{Kind: "type", Caption: "hi"}}},
		{"keys", schema.ActionRecord{Call: js(`{"action":"key","keys":["ctrl","s"]}`)}, gridCoords, pointer{}, []Mark{{Kind: "key", Caption: "ctrl+s"}}},
		{"terminate failure", schema.ActionRecord{Call: js(`{"action":"terminate","status":"failure"}`)}, gridCoords, pointer{}, []Mark{{Kind: "fail", Caption: "terminate failure"}}},
		{"code: click", schema.ActionRecord{Action: "pyautogui.click(12, 34)"}, gridCoords, pointer{}, []Mark{{Kind: "click", At: true, X: 12, Y: 34}}},
		{"code: drag", schema.ActionRecord{Action: "pyautogui.dragTo(7, 8, duration=0.5)"}, gridCoords, pointer{true, 1, 2},
			[]Mark{{Kind: "drag", At: true, X: 7, Y: 8, From: true, X0: 1, Y0: 2}}},
		{"code: scroll", schema.ActionRecord{Action: "pyautogui.scroll(5, x=3, y=4)"}, gridCoords, pointer{}, []Mark{{Kind: "scroll", At: true, X: 3, Y: 4, DY: -1, Caption: "scroll 5"}}},
		{"code: typed lines", schema.ActionRecord{Action: "pyautogui.typewrite('a, \\'b\\'')\npyautogui.press('enter')\npyautogui.typewrite('c')"}, gridCoords, pointer{},
			[]Mark{{Kind: "type", Caption: "a, 'b'\nc"}}},
		{"code: hotkey", schema.ActionRecord{Action: "pyautogui.hotkey('ctrl', 'shift', 't')"}, gridCoords, pointer{}, []Mark{{Kind: "key", Caption: "ctrl+shift+t"}}},
		{"code: DONE", schema.ActionRecord{Action: "DONE"}, gridCoords, pointer{}, []Mark{{Kind: "done", Caption: "done"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := c.ptr
			got := markAction(c.a, c.coords, 640, 400, &p)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("marks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCoordsOf(t *testing.T) {
	for h, want := range map[string]string{"": gridCoords, "qwen qwen3vl, image max 3": gridCoords, "qwen qwen25vl, image max 3": pixelCoords} {
		if got := coordsOf(&schema.Batch{Harness: h}); got != want {
			t.Errorf("harness %q: %s, want %s", h, got, want)
		}
	}
	if got := coordsOf(nil); got != gridCoords {
		t.Errorf("no batch.json: %s, want %s", got, gridCoords)
	}
}

func TestFileName(t *testing.T) {
	if got := fileName("r-00012_a.b"); got != "r-00012_a.b" {
		t.Errorf("a plain id became %q", got)
	}
	a, b := fileName("v1/t"), fileName("v1_t")
	if a == b || a[:4] != "v1_t" {
		t.Errorf("fileName(v1/t) = %q, fileName(v1_t) = %q: want distinct safe names", a, b)
	}
	if got := fileName("../x"); got[0] == '.' {
		t.Errorf("fileName(../x) = %q starts with a dot", got)
	}
}
