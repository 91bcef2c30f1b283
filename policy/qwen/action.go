package qwen

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"legato/rl/desktop"
)

// Actions of the computer_use tool.
const (
	ActionKey           = "key"
	ActionType          = "type"
	ActionMouseMove     = "mouse_move"
	ActionLeftClick     = "left_click"
	ActionLeftClickDrag = "left_click_drag"
	ActionRightClick    = "right_click"
	ActionMiddleClick   = "middle_click"
	ActionDoubleClick   = "double_click"
	ActionTripleClick   = "triple_click"
	ActionScroll        = "scroll"
	ActionHScroll       = "hscroll"
	ActionWait          = "wait"
	ActionTerminate     = "terminate"
	ActionAnswer        = "answer"
)

// actions lists the tool's actions in the order the prompt declares them.
func actions() []string {
	return []string{
		ActionKey, ActionType, ActionMouseMove, ActionLeftClick, ActionLeftClickDrag,
		ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick,
		ActionScroll, ActionHScroll, ActionWait, ActionTerminate, ActionAnswer,
	}
}

func knownAction(a string) bool {
	switch a {
	case ActionKey, ActionType, ActionMouseMove, ActionLeftClick, ActionLeftClickDrag,
		ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick,
		ActionScroll, ActionHScroll, ActionWait, ActionTerminate, ActionAnswer:
		return true
	}
	return false
}

// Bounds on what one call may ask for. They keep a generated program well
// under the guest's limit on one command-line argument (128 KiB), and turn
// values no sane agent emits into parse errors instead of runaway input.
const (
	// MaxTextLen is the most characters one type action may type.
	MaxTextLen = 8192
	// MaxKeys is the most keys one key action may press together.
	MaxKeys = 8
	// MaxScroll is the largest scroll amount, in pyautogui clicks.
	MaxScroll = 10000
	// MaxWait is the longest wait, in seconds.
	MaxWait = 600
)

// dragDuration is how long a left_click_drag takes, in seconds, as in
// OSWorld's agent: a drag that is too fast is not seen as one by many
// applications.
const dragDuration = 0.5

// Call is one computer_use call as the model wrote it. Coordinates are in
// the model's space (the 0–999 grid, or pixels of the resized screenshot);
// Pyautogui maps them onto the screen.
type Call struct {
	Action string `json:"action"`
	// Keys are the key names of a key action, as written.
	Keys []string `json:"keys,omitempty"`
	// Text is what a type action types, or an answer's answer.
	Text string `json:"text,omitempty"`
	// Coordinate is [x, y], or nil when the call has none.
	Coordinate []float64 `json:"coordinate,omitempty"`
	// Pixels is a scroll amount: positive is up (scroll) or right
	// (hscroll).
	Pixels float64 `json:"pixels,omitempty"`
	// Time is a wait's duration in seconds.
	Time float64 `json:"time,omitempty"`
	// Status is terminate's "success" or "failure".
	Status string `json:"status,omitempty"`
}

// Pyautogui returns the desktop action for c on screen: pyautogui code for
// OSWorld's guest, or WAIT, DONE, FAIL. The error, when c cannot be done
// (an argument missing, out of range, an unknown key), wraps one of the
// package's sentinels.
func (c Call) Pyautogui(screen Screen) (desktop.Action, error) {
	prog, special, err := c.compile(screen)
	if err != nil {
		return desktop.Action{}, err
	}
	if prog == nil {
		return special, nil
	}
	return desktop.Action{Kind: desktop.Code, Code: prog.String()}, nil
}

// compile turns c into a pyautogui program, or into a special action when
// the program is nil.
func (c Call) compile(screen Screen) (program, desktop.Action, error) {
	if err := screen.validate(); err != nil {
		return nil, desktop.Action{}, err
	}
	switch c.Action {
	case ActionLeftClick, ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick:
		fn := clickFunction(c.Action)
		if c.Coordinate == nil {
			// Like OSWorld's agent: a click without a coordinate clicks
			// where the pointer is (after a mouse_move, say).
			return program{{Fn: fn}}, desktop.Action{}, nil
		}
		x, y, err := screen.point(c.Coordinate)
		if err != nil {
			return nil, desktop.Action{}, err
		}
		return program{{Fn: fn, Args: []any{x, y}}}, desktop.Action{}, nil

	case ActionMouseMove, ActionLeftClickDrag:
		if c.Coordinate == nil {
			return nil, desktop.Action{}, fmt.Errorf("%w: %s needs a coordinate", ErrMissingArgument, c.Action)
		}
		x, y, err := screen.point(c.Coordinate)
		if err != nil {
			return nil, desktop.Action{}, err
		}
		if c.Action == ActionMouseMove {
			return program{{Fn: "moveTo", Args: []any{x, y}}}, desktop.Action{}, nil
		}
		return program{{Fn: "dragTo", Args: []any{x, y}, Kwargs: []kwarg{{"duration", dragDuration}}}}, desktop.Action{}, nil

	case ActionType:
		prog, err := typeProgram(c.Text)
		return prog, desktop.Action{}, err

	case ActionKey:
		keys, err := keyNames(c.Keys)
		if err != nil {
			return nil, desktop.Action{}, err
		}
		args := make([]any, len(keys))
		for i, k := range keys {
			args[i] = k
		}
		if len(keys) == 1 {
			return program{{Fn: "press", Args: args}}, desktop.Action{}, nil
		}
		return program{{Fn: "hotkey", Args: args}}, desktop.Action{}, nil

	case ActionScroll, ActionHScroll:
		clicks := math.Round(c.Pixels)
		if math.IsNaN(clicks) || clicks == 0 {
			return nil, desktop.Action{}, fmt.Errorf("%w: %s needs a non-zero pixels", ErrMissingArgument, c.Action)
		}
		if math.Abs(clicks) > MaxScroll {
			return nil, desktop.Action{}, fmt.Errorf("%w: pixels %v: must be within ±%d", ErrOutOfRange, c.Pixels, MaxScroll)
		}
		call := pyCall{Fn: c.Action, Args: []any{int(clicks)}}
		if c.Coordinate != nil {
			x, y, err := screen.point(c.Coordinate)
			if err != nil {
				return nil, desktop.Action{}, err
			}
			call.Kwargs = []kwarg{{"x", x}, {"y", y}}
		}
		return program{call}, desktop.Action{}, nil

	case ActionWait:
		if !(c.Time >= 0 && c.Time <= MaxWait) {
			return nil, desktop.Action{}, fmt.Errorf("%w: time %v: must be 0 to %d seconds", ErrOutOfRange, c.Time, MaxWait)
		}
		return nil, desktop.WaitAction, nil

	case ActionTerminate:
		switch strings.ToLower(strings.TrimSpace(c.Status)) {
		case "", "success":
			return nil, desktop.DoneAction, nil
		case "failure":
			return nil, desktop.FailAction, nil
		}
		return nil, desktop.Action{}, fmt.Errorf("%w: status %q: must be success or failure", ErrBadArgument, c.Status)

	case ActionAnswer:
		if utf8.RuneCountInString(c.Text) > MaxTextLen {
			return nil, desktop.Action{}, fmt.Errorf("%w: answer of %d characters: at most %d", ErrOutOfRange, utf8.RuneCountInString(c.Text), MaxTextLen)
		}
		return nil, desktop.WaitAction, nil
	}
	return nil, desktop.Action{}, fmt.Errorf("%w %q", ErrUnknownAction, c.Action)
}

// clickFunction returns the pyautogui function of a click action.
func clickFunction(action string) string {
	switch action {
	case ActionRightClick:
		return "rightClick"
	case ActionMiddleClick:
		return "middleClick"
	case ActionDoubleClick:
		return "doubleClick"
	case ActionTripleClick:
		return "tripleClick"
	}
	return "click"
}

// point maps a model coordinate onto the screen. Qwen3VL coordinates are
// on a 0–999 grid (1000 is tolerated: some models use 0–1000); Qwen25VL
// coordinates are pixels of the resized screenshot. The result is
// truncated like OSWorld's agent does and kept on the screen.
func (s Screen) point(coord []float64) (x, y int, err error) {
	if len(coord) != 2 {
		return 0, 0, fmt.Errorf("%w: coordinate %v: must be [x, y]", ErrBadArgument, coord)
	}
	spanX, spanY := 999.0, 999.0
	limX, limY := 1000.0, 1000.0
	if s.Style == Qwen25VL {
		spanX, spanY = float64(s.ImageWidth), float64(s.ImageHeight)
		limX, limY = spanX, spanY
	}
	cx, cy := coord[0], coord[1]
	if !(cx >= 0 && cx <= limX && cy >= 0 && cy <= limY) {
		return 0, 0, fmt.Errorf("%w: coordinate [%v, %v]: must be within [0, %v]×[0, %v]", ErrOutOfRange, cx, cy, limX, limY)
	}
	x = min(int(cx*float64(s.Width)/spanX), s.Width-1)
	y = min(int(cy*float64(s.Height)/spanY), s.Height-1)
	return x, y, nil
}

// typeProgram types text, pressing Enter for each line break (\n, \r\n or
// \r) rather than leaving line breaks to typewrite.
func typeProgram(text string) (program, error) {
	if text == "" {
		return nil, fmt.Errorf("%w: type needs a non-empty text", ErrMissingArgument)
	}
	if n := utf8.RuneCountInString(text); n > MaxTextLen {
		return nil, fmt.Errorf("%w: text of %d characters: at most %d per type action", ErrOutOfRange, n, MaxTextLen)
	}
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	lines := strings.Split(text, "\n")
	var prog program
	for i, line := range lines {
		if line != "" {
			prog = append(prog, pyCall{Fn: "typewrite", Args: []any{line}})
		}
		if i < len(lines)-1 {
			prog = append(prog, pyCall{Fn: "press", Args: []any{"enter"}})
		}
	}
	return prog, nil
}

// keyNames turns the keys of a key action into pyautogui key names:
// combinations written as one string ("ctrl+c") are split, names are
// lowercased and common spellings mapped ("control" → "ctrl", "arrowup" →
// "up", "page_down" → "pagedown"), and every name must be one of
// pyautogui's.
func keyNames(keys []string) ([]string, error) {
	if len(keys) > MaxKeys {
		return nil, fmt.Errorf("%w: %d keys: at most %d at once", ErrOutOfRange, len(keys), MaxKeys)
	}
	var out []string
	for _, k := range keys {
		parts, err := splitCombo(k)
		if err != nil {
			return nil, err
		}
		for _, p := range parts {
			name, ok := keyName(p)
			if !ok {
				return nil, fmt.Errorf("%w %q: use pyautogui key names such as enter, ctrl, shift, alt, tab, esc, a, f5", ErrUnknownKey, truncate(p, 40))
			}
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: key needs keys", ErrMissingArgument)
	}
	if len(out) > MaxKeys {
		return nil, fmt.Errorf("%w: %d keys: at most %d at once", ErrOutOfRange, len(out), MaxKeys)
	}
	return out, nil
}

// splitCombo splits "ctrl+shift+t" into its keys; "+" and "ctrl++" name the
// plus key.
func splitCombo(k string) ([]string, error) {
	if utf8.RuneCountInString(k) <= 1 || !strings.Contains(k, "+") {
		return []string{k}, nil
	}
	rest, plus := k, false
	if strings.HasSuffix(rest, "++") {
		rest, plus = rest[:len(rest)-2], true
	}
	var parts []string
	for _, p := range strings.Split(rest, "+") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%w %q: an empty key in the combination", ErrUnknownKey, truncate(k, 40))
		}
		parts = append(parts, p)
	}
	if plus {
		parts = append(parts, "+")
	}
	return parts, nil
}

// keyName returns the pyautogui name of the key k, and whether there is
// one.
func keyName(k string) (string, bool) {
	if utf8.RuneCountInString(k) > 1 {
		k = strings.ToLower(strings.TrimSpace(k))
		if utf8.RuneCountInString(k) > 1 {
			k = strings.NewReplacer("_", "", "-", "", " ", "").Replace(k)
		}
		if alias, ok := keyAliases[k]; ok {
			k = alias
		}
	} else {
		k = strings.ToLower(k)
	}
	return k, pyautoguiKeys[k]
}

// keyAliases maps spellings models often use (xdotool's, browsers',
// Anthropic's) to pyautogui names. Read-only.
var keyAliases = map[string]string{
	"control":    "ctrl",
	"ctl":        "ctrl",
	"controll":   "ctrlleft", // xdotool's Control_L
	"controlr":   "ctrlright",
	"shiftl":     "shiftleft",
	"shiftr":     "shiftright",
	"altl":       "altleft",
	"altr":       "altright",
	"super":      "win",
	"superl":     "winleft",
	"superr":     "winright",
	"meta":       "win",
	"windows":    "win",
	"cmd":        "command",
	"arrowup":    "up",
	"arrowdown":  "down",
	"arrowleft":  "left",
	"arrowright": "right",
	"uparrow":    "up",
	"downarrow":  "down",
	"leftarrow":  "left",
	"rightarrow": "right",
	"spacebar":   "space",
	"ins":        "insert",
	"kpenter":    "enter",
}

// pyautoguiKeys is pyautogui's KEYBOARD_KEYS: the only key names the guest
// is ever sent. Read-only.
var pyautoguiKeys = func() map[string]bool {
	names := []string{
		"\t", "\n", "\r", " ", "!", "\"", "#", "$", "%", "&", "'", "(", ")", "*", "+", ",", "-", ".", "/",
		"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ":", ";", "<", "=", ">", "?", "@",
		"[", "\\", "]", "^", "_", "`",
		"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
		"t", "u", "v", "w", "x", "y", "z", "{", "|", "}", "~",
		"accept", "add", "alt", "altleft", "altright", "apps", "backspace",
		"browserback", "browserfavorites", "browserforward", "browserhome", "browserrefresh",
		"browsersearch", "browserstop", "capslock", "clear", "convert", "ctrl", "ctrlleft",
		"ctrlright", "decimal", "del", "delete", "divide", "down", "end", "enter", "esc", "escape",
		"execute",
		"f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10", "f11", "f12",
		"f13", "f14", "f15", "f16", "f17", "f18", "f19", "f20", "f21", "f22", "f23", "f24",
		"final", "fn", "hanguel", "hangul", "hanja", "help", "home", "insert", "junja", "kana",
		"kanji", "launchapp1", "launchapp2", "launchmail", "launchmediaselect", "left",
		"modechange", "multiply", "nexttrack", "nonconvert",
		"num0", "num1", "num2", "num3", "num4", "num5", "num6", "num7", "num8", "num9",
		"numlock", "pagedown", "pageup", "pause", "pgdn", "pgup", "playpause", "prevtrack",
		"print", "printscreen", "prntscrn", "prtsc", "prtscr", "return", "right", "scrolllock",
		"select", "separator", "shift", "shiftleft", "shiftright", "sleep", "space", "stop",
		"subtract", "tab", "up", "volumedown", "volumemute", "volumeup", "win", "winleft",
		"winright", "yen", "command", "option", "optionleft", "optionright",
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}()

// program is a sequence of pyautogui calls, one per line.
type program []pyCall

// pyCall is one call pyautogui.Fn(Args..., Kwargs...). Arguments are int,
// float64 or string, the only values the code generator can write.
type pyCall struct {
	Fn     string
	Args   []any
	Kwargs []kwarg
}

type kwarg struct {
	Name  string
	Value any
}

func (p program) String() string {
	var b strings.Builder
	for i, c := range p {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString("pyautogui.")
		b.WriteString(c.Fn)
		b.WriteByte('(')
		for j, a := range c.Args {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyValue(a))
		}
		for j, kw := range c.Kwargs {
			if j > 0 || len(c.Args) > 0 {
				b.WriteString(", ")
			}
			b.WriteString(kw.Name)
			b.WriteByte('=')
			b.WriteString(pyValue(kw.Value))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// pyValue writes v as a Python literal.
func pyValue(v any) string {
	switch v := v.(type) {
	case int:
		return strconv.Itoa(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case string:
		return pyString(v)
	}
	// Unreachable: compile builds arguments of the three types above only.
	panic(fmt.Sprintf("qwen: no Python literal for %T", v))
}

// pyString returns s as a single-quoted Python string literal whose value
// is exactly s (with invalid UTF-8 read as U+FFFD).
//
// Why it is safe: inside a single-quoted, non-raw Python literal, only
// three characters are not themselves — the quote (ends the literal), the
// backslash (starts an escape) and a line break (a syntax error). The
// literal built here contains printable ASCII other than those verbatim,
// and every other character as an escape: \' and \\ for the two, \xNN,
// \uNNNN or \UNNNNNNNN with its code point for the rest. Each escape stands
// for exactly its character, so the literal ends exactly at the closing
// quote written here, whatever s contains, and the program stays ASCII.
func pyString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for _, r := range s {
		switch {
		case r == '\'':
			b.WriteString(`\'`)
		case r == '\\':
			b.WriteString(`\\`)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
