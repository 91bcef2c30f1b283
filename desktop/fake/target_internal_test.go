package fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"testing"

	"legato/rl/desktop"
)

func TestParseTarget(t *testing.T) {
	for _, tt := range []struct {
		ev       string
		grid     int
		isTarget bool
		wantErr  bool
	}{
		{`{"func": "fake_target"}`, DefaultTargetGrid, true, false},
		{`{"func": "fake_target", "grid": 8}`, 8, true, false},
		{`{"func": "fake_target", "grid": 1}`, 1, true, false},
		{`{"func": "fake_target", "grid": 0}`, 0, true, true},
		{`{"func": "fake_target", "grid": 17}`, 0, true, true},
		{`{"func": "fake_target", "grid": "4"}`, 0, true, true},
		{`{"func": "fake_target", "size": 4}`, 0, true, true},
		{`{"func": "exact_match", "grid": 4}`, 0, false, false},
		{`{"func": "infeasible"}`, 0, false, false},
		{`not json`, 0, false, false},
	} {
		grid, ok, err := ParseTarget(json.RawMessage(tt.ev))
		if grid != tt.grid || ok != tt.isTarget || (err != nil) != tt.wantErr {
			t.Errorf("ParseTarget(%s) = %d, %v, %v; want %d, %v, error %v", tt.ev, grid, ok, err, tt.grid, tt.isTarget, tt.wantErr)
		}
	}
}

func TestPointerFollowsClicks(t *testing.T) {
	for _, tt := range []struct {
		name    string
		code    []string
		clicked bool
		click   image.Point
	}{
		{"click at", []string{"pyautogui.click(10, 20)"}, true, image.Pt(10, 20)},
		{"double click", []string{"pyautogui.doubleClick(7, 8)"}, true, image.Pt(7, 8)},
		{"keywords", []string{"pyautogui.click(x=3, y=4)"}, true, image.Pt(3, 4)},
		{"move then click", []string{"pyautogui.moveTo(100, 200)", "pyautogui.click()"}, true, image.Pt(100, 200)},
		{"drag then click", []string{"pyautogui.dragTo(5, 6, duration=0.5)\npyautogui.click()"}, true, image.Pt(5, 6)},
		{"first click counts", []string{"pyautogui.click(1, 2)", "pyautogui.click(300, 400)"}, true, image.Pt(1, 2)},
		{"right click is no click", []string{"pyautogui.rightClick(50, 60)"}, false, image.Point{}},
		{"right click moves", []string{"pyautogui.rightClick(50, 60)", "pyautogui.click()"}, true, image.Pt(50, 60)},
		{"typing is no click", []string{"pyautogui.write('click(1, 2)')", "pyautogui.press('enter')"}, false, image.Point{}},
		{"not pyautogui", []string{"click(1, 2)"}, false, image.Point{}},
	} {
		var p pointer
		for _, c := range tt.code {
			p.follow(c)
		}
		if p.clicked != tt.clicked || p.click != tt.click {
			t.Errorf("%s: clicked %v at %v; want %v at %v", tt.name, p.clicked, p.click, tt.clicked, tt.click)
		}
	}
}

func TestTargetRectCentresInside(t *testing.T) {
	for _, grid := range []int{1, 2, 4, 7, 16} {
		for col := range grid {
			for row := range grid {
				r := targetRect(1920, 1080, grid, col, row)
				cx, cy := (2*col+1)*1920/(2*grid), (2*row+1)*1080/(2*grid)
				if !image.Pt(cx, cy).In(r) {
					t.Fatalf("grid %d cell (%d, %d): centre (%d, %d) outside the target %v", grid, col, row, cx, cy, r)
				}
				if col+1 < grid {
					next := targetRect(1920, 1080, grid, col+1, row)
					if next.Overlaps(r) || image.Pt((2*col+3)*1920/(2*grid), cy).In(r) {
						t.Fatalf("grid %d: cells (%d, %d) and (%d, %d) share points", grid, col, row, col+1, row)
					}
				}
			}
		}
	}
}

// A fleet's screens are shared by its desktops: a target task's screen must
// leave nothing behind on the next task's, even one whose background is
// the target screen's grey (its frame skips painting the background again
// when the screen already has it).
func TestTargetScreenLeavesNothingBehind(t *testing.T) {
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprint("plain-", i); uint8(32+hashKey(c)%192) == targetBgIdx {
			id = c
		}
	}
	plain := desktop.Task{ID: id, Domain: "os", Evaluator: json.RawMessage(`{"func": "exact_match"}`)}
	shot := func(d desktop.Desktop, task desktop.Task) []byte {
		t.Helper()
		if err := d.Reset(t.Context(), task); err != nil {
			t.Fatal(err)
		}
		obs, err := d.Observe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return obs.Screenshot
	}
	fresh := New(Config{})
	want := shot(fresh, plain)
	fresh.Close()

	d := New(Config{})
	defer d.Close()
	shot(d, desktop.Task{ID: "t", Domain: "os", Evaluator: json.RawMessage(`{"func": "fake_target", "grid": 1}`)})
	if got := shot(d, plain); !bytes.Equal(got, want) {
		t.Error("a plain task's screen after a target task differs from its screen on a fresh desktop")
	}
}
