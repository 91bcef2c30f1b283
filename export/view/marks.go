package view

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// Mark is one thing an action did, drawn over the screenshot the model saw
// when it chose it: a point (a click, a move), a path (a drag), an arrow (a
// scroll), or a caption (typed text, keys, a wait, the end). Coordinates
// are pixels of that screenshot.
type Mark struct {
	// Kind is click, double, triple, right, middle, move, drag, scroll,
	// type, key, wait, done, fail, answer or other.
	Kind string
	// At says X and Y hold a point; From says X0 and Y0 hold where a drag
	// started (the pointer's position before it).
	At, From bool
	X, Y     float64
	X0, Y0   float64
	// DX and DY are a scroll's direction: -1, 0 or 1 on each axis (screen
	// axes: DY -1 is up).
	DX, DY int
	// Caption is the text shown for the mark: what was typed, the keys, an
	// answer.
	Caption string
}

// Coordinate conventions of the harness that wrote a run: Qwen3-VL models
// write coordinates on a 0–999 grid of the screenshot, Qwen2.5-VL models
// pixels of the resized screenshot, which is the image the prompt holds.
const (
	gridCoords  = "grid"
	pixelCoords = "pixels"
)

// coordsOf says which convention batch.json's harness description names
// (policy/qwen's Describe: "qwen qwen25vl, ..."); the grid, the default
// harness's, when it says nothing.
func coordsOf(b *schema.Batch) string {
	if b != nil && strings.HasPrefix(b.Harness, "qwen qwen25vl") {
		return pixelCoords
	}
	return gridCoords
}

// pointer follows the mouse through an attempt's actions, for where a drag
// starts; unknown (nil) until an action puts it somewhere.
type pointer struct {
	known bool
	x, y  float64
}

// markAction returns the marks of one action on a w×h screenshot, and
// moves p. The parsed call decides when the record has one; otherwise the
// pyautogui code does, whose coordinates are the screen's pixels, taken as
// the screenshot's (the screen's size is not recorded; the default harness
// sends a screenshot at the screen's size).
func markAction(a schema.ActionRecord, coords string, w, h int, p *pointer) []Mark {
	var c qwen.Call
	if len(a.Call) > 0 && json.Unmarshal(a.Call, &c) == nil && c.Action != "" {
		return markCall(c, coords, w, h, p)
	}
	return markCode(a.Action, p)
}

// scale maps a model coordinate onto the screenshot, as policy/qwen's
// Screen.point maps it onto the screen.
func scale(coord []float64, coords string, w, h int) (float64, float64, bool) {
	if len(coord) != 2 || math.IsNaN(coord[0]) || math.IsNaN(coord[1]) {
		return 0, 0, false
	}
	x, y := coord[0], coord[1]
	if coords == gridCoords {
		x, y = x*float64(w)/999, y*float64(h)/999
	}
	return min(max(x, 0), float64(w)), min(max(y, 0), float64(h)), true
}

func markCall(c qwen.Call, coords string, w, h int, p *pointer) []Mark {
	m := Mark{Kind: c.Action}
	x, y, at := scale(c.Coordinate, coords, w, h)
	switch c.Action {
	case "left_click", "right_click", "middle_click", "double_click", "triple_click", "mouse_move":
		m.Kind = map[string]string{"left_click": "click", "right_click": "right", "middle_click": "middle",
			"double_click": "double", "triple_click": "triple", "mouse_move": "move"}[c.Action]
		if !at && p.known { // a click without a coordinate clicks where the pointer is
			x, y, at = p.x, p.y, true
		}
	case "left_click_drag":
		m.Kind = "drag"
		if p.known {
			m.From, m.X0, m.Y0 = true, p.x, p.y
		}
	case "scroll", "hscroll":
		m.Kind = "scroll"
		if !at {
			x, y, at = float64(w)/2, float64(h)/2, true
		}
		d := sign(c.Pixels)
		if c.Action == "scroll" {
			m.DY = -d // positive pixels scroll up
		} else {
			m.DX = d
		}
		m.Caption = fmt.Sprintf("%s %g", c.Action, c.Pixels)
	case "type":
		m.Caption = c.Text
	case "key":
		m.Caption = strings.Join(c.Keys, "+")
	case "wait":
		m.Caption = fmt.Sprintf("wait %gs", c.Time)
	case "terminate":
		m.Kind = "done"
		if strings.EqualFold(strings.TrimSpace(c.Status), "failure") {
			m.Kind = "fail"
		}
		m.Caption = "terminate " + c.Status
	case "answer":
		m.Caption = c.Text
	default:
		m.Kind = "other"
		m.Caption = c.Action
	}
	if at {
		m.At, m.X, m.Y = true, x, y
		p.known, p.x, p.y = true, x, y
	}
	return []Mark{m}
}

func sign(v float64) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// pyCallRE matches one pyautogui call of the code legato writes (one call
// a line, arguments as Python literals).
var pyCallRE = regexp.MustCompile(`pyautogui\.(\w+)\((.*)\)\s*$`)

// markCode reads the marks of pyautogui code, WAIT, DONE or FAIL.
func markCode(code string, p *pointer) []Mark {
	switch strings.TrimSpace(code) {
	case "WAIT":
		return []Mark{{Kind: "wait", Caption: "wait"}}
	case "DONE":
		return []Mark{{Kind: "done", Caption: "done"}}
	case "FAIL":
		return []Mark{{Kind: "fail", Caption: "fail"}}
	}
	var out []Mark
	var typed []string
	for _, line := range strings.Split(code, "\n") {
		sm := pyCallRE.FindStringSubmatch(line)
		if sm == nil {
			continue
		}
		args, kw := pyArgs(sm[2])
		num := func(i int) (float64, bool) {
			if i >= len(args) {
				return 0, false
			}
			v, err := strconv.ParseFloat(args[i], 64)
			return v, err == nil
		}
		m := Mark{}
		switch sm[1] {
		case "click", "doubleClick", "rightClick", "middleClick", "tripleClick", "moveTo", "dragTo":
			m.Kind = map[string]string{"click": "click", "doubleClick": "double", "rightClick": "right",
				"middleClick": "middle", "tripleClick": "triple", "moveTo": "move", "dragTo": "drag"}[sm[1]]
			x, okx := num(0)
			y, oky := num(1)
			if m.Kind == "drag" && p.known {
				m.From, m.X0, m.Y0 = true, p.x, p.y
			}
			if okx && oky {
				m.At, m.X, m.Y = true, x, y
			} else if p.known {
				m.At, m.X, m.Y = true, p.x, p.y
			}
		case "scroll", "hscroll":
			m.Kind = "scroll"
			n, _ := num(0)
			if m.DY = -sign(n); sm[1] == "hscroll" {
				m.DX, m.DY = sign(n), 0
			}
			x, errx := strconv.ParseFloat(kw["x"], 64)
			y, erry := strconv.ParseFloat(kw["y"], 64)
			if errx == nil && erry == nil {
				m.At, m.X, m.Y = true, x, y
			}
			m.Caption = fmt.Sprintf("%s %g", sm[1], n)
		case "typewrite", "write":
			if len(args) > 0 {
				typed = append(typed, pyUnquote(args[0]))
			}
			continue
		case "press", "hotkey", "keyDown", "keyUp":
			if sm[1] == "press" && len(args) == 1 && pyUnquote(args[0]) == "enter" && len(typed) > 0 {
				typed = append(typed, "\n")
				continue
			}
			m.Kind = "key"
			keys := make([]string, len(args))
			for i, a := range args {
				keys[i] = pyUnquote(a)
			}
			m.Caption = strings.Join(keys, "+")
		default:
			m.Kind, m.Caption = "other", strings.TrimSpace(line)
		}
		if m.At {
			p.known, p.x, p.y = true, m.X, m.Y
		}
		out = append(out, m)
	}
	if len(typed) > 0 {
		out = append(out, Mark{Kind: "type", Caption: strings.Join(typed, "")})
	}
	if len(out) == 0 && strings.TrimSpace(code) != "" {
		out = append(out, Mark{Kind: "other", Caption: code})
	}
	return out
}

// pyArgs splits the arguments of a call legato wrote: positional ones, and
// name=value ones. Strings are single-quoted literals whose quotes and
// backslashes are escaped, so a comma inside one is found by tracking them.
func pyArgs(s string) (args []string, kw map[string]string) {
	kw = map[string]string{}
	var parts []string
	start, inStr := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inStr && c == '\\':
			i++
		case c == '\'':
			inStr = !inStr
		case !inStr && c == ',':
			parts = append(parts, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	if rest := strings.TrimSpace(s[start:]); rest != "" {
		parts = append(parts, rest)
	}
	for _, p := range parts {
		if name, v, ok := strings.Cut(p, "="); ok && !strings.HasPrefix(p, "'") {
			kw[strings.TrimSpace(name)] = strings.TrimSpace(v)
			continue
		}
		args = append(args, p)
	}
	return args, kw
}

// pyUnquote returns the value of a single-quoted Python literal as legato
// writes them (\\, \', \n, \t, \r, \xNN, \uNNNN, \UNNNNNNNN); anything else
// is returned as it is.
func pyUnquote(s string) string {
	if len(s) < 2 || s[0] != '\'' || s[len(s)-1] != '\'' {
		return s
	}
	if v, err := strconv.Unquote(`"` + strings.ReplaceAll(strings.ReplaceAll(s[1:len(s)-1], `\'`, `'`), `"`, `\"`) + `"`); err == nil {
		return v
	}
	return s[1 : len(s)-1]
}
