package fake

import (
	"encoding/json"
	"fmt"
	"image"
	"strconv"
	"strings"
)

// TargetFunc is the evaluator func of a target task: the screen shows a
// target at a place drawn for each attempt, and the attempt's first click
// decides the reward: 1 inside the target, 0 anywhere else (or with no
// click, or after FAIL). Unlike the drawn rewards of Reward, a target
// task's reward depends only on what the agent did, so a policy can learn
// it, and replay and regrade give the same reward from the same actions.
//
// The evaluator is {"func": "fake_target"} with an optional "grid" (1 to
// 16, default DefaultTargetGrid): the screen is cut into grid×grid cells,
// and the target fills the middle of one of them, so that chance is
// 1/grid² for a policy that clicks cells' centres.
const TargetFunc = "fake_target"

// DefaultTargetGrid is the grid of a target task that gives none.
const DefaultTargetGrid = 4

// maxTargetGrid bounds "grid": beyond it a cell of a 1920×1080 screen is a
// few dozen pixels, smaller than a screenshot downscaled for a model shows.
const maxTargetGrid = 16

// targetSpec is a target task's evaluator.
type targetSpec struct {
	Func string `json:"func"`
	Grid *int   `json:"grid"`
}

// ParseTarget reports whether evaluator is a target task's and, if it is,
// its grid. A target evaluator with a bad grid or an unknown field is an
// error naming it.
func ParseTarget(evaluator json.RawMessage) (grid int, ok bool, err error) {
	var head struct {
		Func string `json:"func"`
	}
	if json.Unmarshal(evaluator, &head) != nil || head.Func != TargetFunc {
		return 0, false, nil
	}
	var spec targetSpec
	dec := json.NewDecoder(strings.NewReader(string(evaluator)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return 0, true, fmt.Errorf("evaluator %s: %v; want {\"func\": %q, \"grid\": N} with N from 1 to %d", TargetFunc, err, TargetFunc, maxTargetGrid)
	}
	grid = DefaultTargetGrid
	if spec.Grid != nil {
		grid = *spec.Grid
	}
	if grid < 1 || grid > maxTargetGrid {
		return 0, true, fmt.Errorf("evaluator %s: grid %d: want 1 to %d", TargetFunc, grid, maxTargetGrid)
	}
	return grid, true, nil
}

// targetRect is the target in cell (col, row) of a grid×grid screen of
// w×h pixels: the cell less an eighth of its size on every side, so that
// a click at the cell's centre is inside and one on a neighbour is not.
func targetRect(w, h, grid, col, row int) image.Rectangle {
	cell := image.Rect(col*w/grid, row*h/grid, (col+1)*w/grid, (row+1)*h/grid)
	dx, dy := cell.Dx()/8, cell.Dy()/8
	return image.Rect(cell.Min.X+dx, cell.Min.Y+dy, cell.Max.X-dx, cell.Max.Y-dy)
}

// pointer follows the mouse through an attempt's pyautogui programs, as
// far as a target task needs: where the pointer is and where the first
// left click was.
type pointer struct {
	at      image.Point
	clicked bool
	click   image.Point
}

// leftClicks are the pyautogui functions that press the left button.
var leftClicks = map[string]bool{"click": true, "doubleClick": true, "tripleClick": true, "leftClick": true}

// follow moves p through code, one pyautogui call per line: a call given a
// place moves the pointer, a left click with or without a place clicks.
// Lines it does not understand change nothing: they are not clicks.
func (p *pointer) follow(code string) {
	for _, line := range strings.Split(code, "\n") {
		fn, args, ok := pyautoguiCall(strings.TrimSpace(line))
		if !ok {
			continue
		}
		// Every call given a place moves the pointer there first (click,
		// moveTo, dragTo, scroll's x= and y=), as pyautogui does.
		if x, y, ok := callPoint(args); ok {
			p.at = image.Pt(x, y)
		}
		if leftClicks[fn] && !p.clicked {
			p.clicked, p.click = true, p.at
		}
	}
}

// pyautoguiCall splits "pyautogui.fn(args)" into fn and its arguments.
func pyautoguiCall(line string) (fn string, args []string, ok bool) {
	rest, ok := strings.CutPrefix(line, "pyautogui.")
	if !ok || !strings.HasSuffix(rest, ")") {
		return "", nil, false
	}
	fn, inner, ok := strings.Cut(strings.TrimSuffix(rest, ")"), "(")
	if !ok {
		return "", nil, false
	}
	for a := range strings.SplitSeq(inner, ",") {
		if a = strings.TrimSpace(a); a != "" {
			args = append(args, a)
		}
	}
	return fn, args, true
}

// callPoint reads a place from a call's arguments: the first two
// positional integers, or x= and y=.
func callPoint(args []string) (x, y int, ok bool) {
	var pos []int
	kw := map[string]int{}
	for _, a := range args {
		if name, v, isKw := strings.Cut(a, "="); isKw {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				kw[strings.TrimSpace(name)] = n
			}
			continue
		}
		if n, err := strconv.Atoi(a); err == nil {
			pos = append(pos, n)
		}
	}
	if len(pos) >= 2 {
		return pos[0], pos[1], true
	}
	x, okX := kw["x"]
	y, okY := kw["y"]
	return x, y, okX && okY
}
