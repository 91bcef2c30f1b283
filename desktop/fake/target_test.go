package fake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"testing"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

func targetTask(id, evaluator string) desktop.Task {
	return desktop.Task{ID: id, Domain: "os", Instruction: "click the red square", Evaluator: json.RawMessage(evaluator)}
}

// findTarget finds the target on a screenshot by its colour: the bounding
// box of the pixels of want.
func findTarget(t *testing.T, shot []byte, want color.RGBA) image.Rectangle {
	t.Helper()
	m, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	var box image.Rectangle
	add := func(x, y int) { box = box.Union(image.Rect(x, y, x+1, y+1)) }
	b := m.Bounds()
	if p, ok := m.(*image.Paletted); ok {
		// The fake's screenshots are paletted: compare indexes, not colours,
		// two million pixels at a time.
		match := make([]bool, len(p.Palette))
		for i, c := range p.Palette {
			match[i] = color.RGBAModel.Convert(c) == want
		}
		for y := b.Min.Y; y < b.Max.Y; y++ {
			row := p.Pix[(y-b.Min.Y)*p.Stride:][:b.Dx()]
			for x, idx := range row {
				if match[idx] {
					add(b.Min.X+x, y)
				}
			}
		}
		return box
	}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if color.RGBAModel.Convert(m.At(x, y)) == want {
				add(x, y)
			}
		}
	}
	return box
}

var (
	red   = color.RGBA{0xff, 0x00, 0x00, 0xff}
	green = color.RGBA{0x00, 0xcc, 0x00, 0xff}
)

func click(p image.Point) desktop.Action {
	return desktop.Action{Kind: desktop.Code, Code: fmt.Sprintf("pyautogui.click(%d, %d)", p.X, p.Y)}
}

// observeTarget resets d to task in ctx and finds the target on its first
// screen.
func observeTarget(t *testing.T, ctx context.Context, d desktop.Desktop, task desktop.Task) image.Rectangle {
	t.Helper()
	box := findTarget(t, firstScreen(t, ctx, d, task), red)
	if box.Empty() {
		t.Fatal("no red target on the screen")
	}
	return box
}

// firstScreen resets d to task in ctx and returns its first screenshot.
func firstScreen(t *testing.T, ctx context.Context, d desktop.Desktop, task desktop.Task) []byte {
	t.Helper()
	if err := d.Reset(ctx, task); err != nil {
		t.Fatal(err)
	}
	obs, err := d.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return obs.Screenshot
}

func TestTargetTaskRewardsTheFirstClick(t *testing.T) {
	d := fake.New(fake.Config{Seed: 3, DefaultReward: fake.Reward{P: 1}})
	defer d.Close()
	task := targetTask("target-1", `{"func": "fake_target"}`)
	centre := func(r image.Rectangle) image.Point { return r.Min.Add(r.Max).Div(2) }
	for _, tt := range []struct {
		name   string
		clicks func(target image.Rectangle) []desktop.Action
		want   float64
	}{
		{"inside", func(r image.Rectangle) []desktop.Action { return []desktop.Action{click(centre(r))} }, 1},
		{"corner inside", func(r image.Rectangle) []desktop.Action { return []desktop.Action{click(r.Min)} }, 1},
		{"just outside", func(r image.Rectangle) []desktop.Action { return []desktop.Action{click(r.Max)} }, 0},
		{"miss then hit", func(r image.Rectangle) []desktop.Action {
			return []desktop.Action{click(r.Max.Add(image.Pt(5, 5))), click(centre(r))}
		}, 0},
		{"no click", func(image.Rectangle) []desktop.Action {
			return []desktop.Action{{Kind: desktop.Code, Code: "pyautogui.press('enter')"}, desktop.DoneAction}
		}, 0},
		{"hit then FAIL", func(r image.Rectangle) []desktop.Action {
			return []desktop.Action{click(centre(r)), desktop.FailAction}
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := desktop.WithAttempt(t.Context(), desktop.Attempt{GroupID: "g", TaskID: task.ID, Index: 2})
			target := observeTarget(t, ctx, d, task)
			for _, a := range tt.clicks(target) {
				if _, err := d.Act(ctx, a); err != nil {
					t.Fatal(err)
				}
			}
			obs, err := d.Observe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The screen says what happened: the target turns green on a hit.
			if hit := !findTarget(t, obs.Screenshot, green).Empty(); hit != (tt.want == 1 || tt.name == "hit then FAIL") {
				t.Errorf("green target on the screen: %v", hit)
			}
			got, err := d.Evaluate(ctx, task)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("reward %v; want %v (target %v)", got, tt.want, target)
			}
		})
	}
}

// The target's place is drawn per attempt: the same on any desktop for the
// same attempt (a replay, a resume), spread over the grid across attempts.
func TestTargetFollowsTheAttempt(t *testing.T) {
	a, b := fake.New(fake.Config{Seed: 9, Name: "a"}), fake.New(fake.Config{Seed: 9, Name: "b"})
	defer a.Close()
	defer b.Close()
	task := targetTask("target-2", `{"func": "fake_target", "grid": 4}`)
	seen := map[image.Rectangle]int{}
	for i := range 64 {
		ctx := desktop.WithAttempt(t.Context(), desktop.Attempt{GroupID: "g", TaskID: task.ID, Index: i})
		shot := firstScreen(t, ctx, a, task)
		if !bytes.Equal(shot, firstScreen(t, ctx, b, task)) {
			t.Fatalf("attempt %d: one screen on one desktop, another on the other", i)
		}
		r := findTarget(t, shot, red)
		if r.Empty() {
			t.Fatalf("attempt %d: no red target on the screen", i)
		}
		seen[r]++
	}
	// 64 draws over 16 cells miss more than 6 of them with probability
	// below 1e-6.
	if len(seen) < 10 {
		t.Errorf("64 attempts put the target in %d of 16 cells: %v", len(seen), seen)
	}
}

// A kept end state grades as the attempt did, on another desktop.
func TestTargetEndStateRegrades(t *testing.T) {
	dir := t.TempDir()
	task := targetTask("target-3", `{"func": "fake_target", "grid": 2}`)
	for i, want := range []float64{1, 0} {
		ctx := desktop.WithAttempt(t.Context(), desktop.Attempt{GroupID: "g", TaskID: task.ID, Index: i})
		d := fake.New(fake.Config{Seed: 5, EndStates: dir})
		target := observeTarget(t, ctx, d, task)
		p := target.Min.Add(target.Max).Div(2)
		if want == 0 {
			p = target.Max.Add(image.Pt(1, 1))
		}
		last := click(p)
		if _, err := d.Act(ctx, last); err != nil {
			t.Fatal(err)
		}
		r, err := d.Evaluate(ctx, task)
		if err != nil || r != want {
			t.Fatalf("attempt %d: reward %v, %v; want %v", i, r, err, want)
		}
		st, err := d.KeepEndState(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		other := fake.New(fake.Config{Seed: 99, EndStates: dir})
		again, err := other.GradeEndState(t.Context(), st.Ref, task, last)
		other.Close()
		if err != nil || again != want {
			t.Errorf("attempt %d regraded: %v, %v; want %v", i, again, err, want)
		}
	}
}

func TestTargetBadEvaluatorIsUnsupported(t *testing.T) {
	d := fake.New(fake.Config{})
	defer d.Close()
	err := d.Reset(t.Context(), targetTask("bad", `{"func": "fake_target", "grid": 40}`))
	if !errors.Is(err, desktop.ErrUnsupported) {
		t.Fatalf("Reset: %v; want an error wrapping ErrUnsupported", err)
	}
}
