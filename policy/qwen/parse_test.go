package qwen

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/policy"
)

// Screens of a 1920×1080 desktop as each style's model sees it.
var (
	screen3  = Config{}.Screen(1920, 1080)                // 0–999 grid
	screen25 = Config{Style: Qwen25VL}.Screen(1920, 1080) // 1316×728 pixels
)

// jsonCall writes a <tool_call> block the way Qwen models do.
func jsonCall(args string) string {
	return "<tool_call>\n{\"name\": \"computer_use\", \"arguments\": " + args + "}\n</tool_call>"
}

// xmlCall writes a call in the XML style of Qwen3-Coder and Qwen3.5.
func xmlCall(params ...string) string {
	var b strings.Builder
	b.WriteString("<tool_call>\n<function=computer_use>\n")
	for i := 0; i+1 < len(params); i += 2 {
		fmt.Fprintf(&b, "<parameter=%s>\n%s\n</parameter>\n", params[i], params[i+1])
	}
	b.WriteString("</function>\n</tool_call>")
	return b.String()
}

func TestParseReply(t *testing.T) {
	tests := []struct {
		name        string
		reply       policy.Reply
		screen      Screen
		wantActions []string
		wantSummary string
		wantErr     error // a sentinel; nil means no error
	}{
		// Every action, in the JSON format.
		{name: "key one", reply: policy.Reply{Content: "Action: Confirm.\n" + jsonCall(`{"action": "key", "keys": ["enter"]}`)},
			wantActions: []string{"pyautogui.press('enter')"}, wantSummary: "Confirm."},
		{name: "key combo", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["ctrl", "c"]}`)},
			wantActions: []string{"pyautogui.hotkey('ctrl', 'c')"}},
		{name: "key combo as one string", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": "ctrl+shift+t"}`)},
			wantActions: []string{"pyautogui.hotkey('ctrl', 'shift', 't')"}},
		{name: "key aliases and case", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["Control", "ArrowUp", "Page_Down", "A"]}`)},
			wantActions: []string{"pyautogui.hotkey('ctrl', 'up', 'pagedown', 'a')"}},
		{name: "key plus", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["ctrl++"]}`)},
			wantActions: []string{"pyautogui.hotkey('ctrl', '+')"}},
		{name: "type", reply: policy.Reply{Content: jsonCall(`{"action": "type", "text": "hello world"}`)},
			wantActions: []string{"pyautogui.typewrite('hello world')"}},
		{name: "type lines", reply: policy.Reply{Content: jsonCall(`{"action": "type", "text": "a\nb\r\nc\n"}`)},
			wantActions: []string{"pyautogui.typewrite('a')\npyautogui.press('enter')\npyautogui.typewrite('b')\npyautogui.press('enter')\npyautogui.typewrite('c')\npyautogui.press('enter')"}},
		{name: "mouse_move", reply: policy.Reply{Content: jsonCall(`{"action": "mouse_move", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.moveTo(960, 324)"}},
		{name: "left_click", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.click(960, 324)"}},
		{name: "left_click corners", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [0, 0]}`) + jsonCall(`{"action": "left_click", "coordinate": [999, 999]}`) + jsonCall(`{"action": "left_click", "coordinate": [1000, 1000]}`)},
			wantActions: []string{"pyautogui.click(0, 0)", "pyautogui.click(1919, 1079)", "pyautogui.click(1919, 1079)"}},
		{name: "left_click where the pointer is", reply: policy.Reply{Content: jsonCall(`{"action": "left_click"}`)},
			wantActions: []string{"pyautogui.click()"}},
		{name: "left_click_drag", reply: policy.Reply{Content: jsonCall(`{"action": "left_click_drag", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.dragTo(960, 324, duration=0.5)"}},
		{name: "right_click", reply: policy.Reply{Content: jsonCall(`{"action": "right_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.rightClick(960, 324)"}},
		{name: "middle_click", reply: policy.Reply{Content: jsonCall(`{"action": "middle_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.middleClick(960, 324)"}},
		{name: "double_click", reply: policy.Reply{Content: jsonCall(`{"action": "double_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.doubleClick(960, 324)"}},
		{name: "triple_click", reply: policy.Reply{Content: jsonCall(`{"action": "triple_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.tripleClick(960, 324)"}},
		{name: "scroll", reply: policy.Reply{Content: jsonCall(`{"action": "scroll", "pixels": -5}`)},
			wantActions: []string{"pyautogui.scroll(-5)"}},
		{name: "scroll at a point", reply: policy.Reply{Content: jsonCall(`{"action": "scroll", "pixels": 3.4, "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.scroll(3, x=960, y=324)"}},
		{name: "hscroll", reply: policy.Reply{Content: jsonCall(`{"action": "hscroll", "pixels": 4}`)},
			wantActions: []string{"pyautogui.hscroll(4)"}},
		{name: "wait", reply: policy.Reply{Content: jsonCall(`{"action": "wait", "time": 2}`)},
			wantActions: []string{"WAIT"}},
		{name: "terminate success", reply: policy.Reply{Content: jsonCall(`{"action": "terminate", "status": "success"}`)},
			wantActions: []string{"DONE"}},
		{name: "terminate failure is FAIL", reply: policy.Reply{Content: jsonCall(`{"action": "terminate", "status": "failure"}`)},
			wantActions: []string{"FAIL"}},
		{name: "terminate without status", reply: policy.Reply{Content: jsonCall(`{"action": "terminate"}`)},
			wantActions: []string{"DONE"}},
		{name: "answer then terminate", reply: policy.Reply{Content: jsonCall(`{"action": "answer", "text": "42"}`) + "\n" + jsonCall(`{"action": "terminate", "status": "success"}`)},
			wantActions: []string{"WAIT", "DONE"}},
		{name: "qwen25vl pixels", screen: screen25, reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [658, 364]}`)},
			wantActions: []string{"pyautogui.click(960, 540)"}},
		{name: "qwen25vl far corner", screen: screen25, reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [1316, 728]}`)},
			wantActions: []string{"pyautogui.click(1919, 1079)"}},

		// Every format.
		{name: "several blocks", reply: policy.Reply{Content: "Action: Open the menu and type.\n" + jsonCall(`{"action": "left_click", "coordinate": [10, 10]}`) + "\n" + jsonCall(`{"action": "type", "text": "x"}`)},
			wantActions: []string{"pyautogui.click(19, 10)", "pyautogui.typewrite('x')"}, wantSummary: "Open the menu and type."},
		{name: "unterminated last block", reply: policy.Reply{Content: "Action: Click.\n" + jsonCall(`{"action": "wait"}`) + "\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"left_click\", \"coordinate\": [500, 300]}}"},
			wantActions: []string{"WAIT", "pyautogui.click(960, 324)"}, wantSummary: "Click."},
		{name: "block on one line", reply: policy.Reply{Content: `<tool_call>{"name": "computer_use", "arguments": {"action": "wait"}}</tool_call>`},
			wantActions: []string{"WAIT"}},
		{name: "arguments as a JSON string", reply: policy.Reply{Content: `<tool_call>{"name": "computer_use", "arguments": "{\"action\": \"key\", \"keys\": [\"esc\"]}"}</tool_call>`},
			wantActions: []string{"pyautogui.press('esc')"}},
		{name: "code fence in block", reply: policy.Reply{Content: "<tool_call>\n```json\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"wait\"}}\n```\n</tool_call>"},
			wantActions: []string{"WAIT"}},
		{name: "xml style", reply: policy.Reply{Content: "Action: Type.\n" + xmlCall("action", "type", "text", "line one\nline two")},
			wantActions: []string{"pyautogui.typewrite('line one')\npyautogui.press('enter')\npyautogui.typewrite('line two')"}, wantSummary: "Type."},
		{name: "xml coordinate and keys", reply: policy.Reply{Content: xmlCall("action", "left_click", "coordinate", "[500, 300]") + xmlCall("action", "key", "keys", `["ctrl", "s"]`) + xmlCall("action", "key", "keys", "enter")},
			wantActions: []string{"pyautogui.click(960, 324)", "pyautogui.hotkey('ctrl', 's')", "pyautogui.press('enter')"}},
		{name: "xml numbers and loose coordinate", reply: policy.Reply{Content: xmlCall("action", "scroll", "pixels", "-3", "coordinate", "500, 300")},
			wantActions: []string{"pyautogui.scroll(-3, x=960, y=324)"}},
		{name: "xml without tool_call", reply: policy.Reply{Content: "<function=computer_use>\n<parameter=action>\nterminate\n</parameter>\n<parameter=status>\nfailure\n</parameter>\n</function>"},
			wantActions: []string{"FAIL"}},
		{name: "xml cut short", reply: policy.Reply{Content: "<tool_call>\n<function=computer_use>\n<parameter=action>\nleft_click\n</parameter>\n<parameter=coordinate>\n[500, 300]"},
			wantActions: []string{"pyautogui.click(960, 324)"}},
		{name: "openai tool_calls", reply: policy.Reply{Content: "Action: Save.", ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: `{"action": "key", "keys": ["ctrl", "s"]}`}}},
			wantActions: []string{"pyautogui.hotkey('ctrl', 's')"}, wantSummary: "Save."},
		{name: "openai tool_calls win over content", reply: policy.Reply{Content: jsonCall(`{"action": "wait"}`), ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: `{"action": "terminate", "status": "success"}`}}},
			wantActions: []string{"DONE"}},
		{name: "bare json line", reply: policy.Reply{Content: "Action: Wait.\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"wait\"}}"},
			wantActions: []string{"WAIT"}, wantSummary: "Wait."},
		{name: "calls inside think are ignored", reply: policy.Reply{Content: "<think>maybe " + jsonCall(`{"action": "terminate", "status": "failure"}`) + "</think>\nAction: Click.\n" + jsonCall(`{"action": "left_click", "coordinate": [500, 300]}`)},
			wantActions: []string{"pyautogui.click(960, 324)"}, wantSummary: "Click."},
		{name: "think opened by the template", reply: policy.Reply{Content: "The dialog is open.\n</think>\n\nAction: Close it.\n" + jsonCall(`{"action": "key", "keys": ["esc"]}`)},
			wantActions: []string{"pyautogui.press('esc')"}, wantSummary: "Close it."},
		{name: "summary without Action prefix", reply: policy.Reply{Content: "I will click OK.\n" + jsonCall(`{"action": "wait"}`)},
			wantActions: []string{"WAIT"}, wantSummary: "I will click OK."},
		{name: "bold Action prefix", reply: policy.Reply{Content: "**Action:** Click OK.\n" + jsonCall(`{"action": "wait"}`)},
			wantActions: []string{"WAIT"}, wantSummary: "Click OK."},
		{name: "unknown arguments ignored", reply: policy.Reply{Content: jsonCall(`{"action": "left_click_drag", "coordinate": [500, 300], "duration": 3}`)},
			wantActions: []string{"pyautogui.dragTo(960, 324, duration=0.5)"}},

		// Replies that do not parse.
		{name: "no call", reply: policy.Reply{Content: "Action: I think the task is done."}, wantSummary: "I think the task is done.", wantErr: ErrNoCall},
		{name: "empty reply", reply: policy.Reply{}, wantErr: ErrNoCall},
		{name: "call only in think", reply: policy.Reply{Content: "<think>" + jsonCall(`{"action": "wait"}`)}, wantErr: ErrNoCall},
		{name: "bad json", reply: policy.Reply{Content: "<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"wait\"}\n</tool_call>"}, wantErr: ErrSyntax},
		{name: "text after the object", reply: policy.Reply{Content: jsonCall(`{"action": "wait"}}`)}, wantErr: ErrSyntax},
		{name: "not a call", reply: policy.Reply{Content: "<tool_call>click the button</tool_call>"}, wantErr: ErrSyntax},
		{name: "empty block", reply: policy.Reply{Content: "<tool_call></tool_call>"}, wantErr: ErrSyntax},
		{name: "arguments not an object", reply: policy.Reply{Content: jsonCall(`[1, 2]`)}, wantErr: ErrSyntax},
		{name: "no arguments", reply: policy.Reply{Content: `<tool_call>{"name": "computer_use"}</tool_call>`}, wantErr: ErrSyntax},
		{name: "unknown function", reply: policy.Reply{Content: `<tool_call>{"name": "browser", "arguments": {"action": "wait"}}</tool_call>`}, wantErr: ErrUnknownFunction},
		{name: "unknown openai function", reply: policy.Reply{ToolCalls: []policy.ToolCall{{Name: "shell", Arguments: `{"cmd": "ls"}`}}}, wantErr: ErrUnknownFunction},
		{name: "openai bad arguments", reply: policy.Reply{ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: `{"action": `}}}, wantErr: ErrSyntax},
		{name: "unknown action", reply: policy.Reply{Content: jsonCall(`{"action": "click", "coordinate": [1, 2]}`)}, wantErr: ErrUnknownAction},
		{name: "missing action", reply: policy.Reply{Content: jsonCall(`{"coordinate": [1, 2]}`)}, wantErr: ErrMissingArgument},
		{name: "action not a string", reply: policy.Reply{Content: jsonCall(`{"action": 3}`)}, wantErr: ErrBadArgument},
		{name: "mouse_move without coordinate", reply: policy.Reply{Content: jsonCall(`{"action": "mouse_move"}`)}, wantErr: ErrMissingArgument},
		{name: "drag without coordinate", reply: policy.Reply{Content: jsonCall(`{"action": "left_click_drag"}`)}, wantErr: ErrMissingArgument},
		{name: "coordinate off the grid", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [1200, 5]}`)}, wantErr: ErrOutOfRange},
		{name: "negative coordinate", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [-1, 5]}`)}, wantErr: ErrOutOfRange},
		{name: "qwen25vl coordinate off the image", screen: screen25, reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [1317, 5]}`)}, wantErr: ErrOutOfRange},
		{name: "three coordinates", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [1, 2, 3]}`)}, wantErr: ErrBadArgument},
		{name: "coordinate not numbers", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": ["1); import os#", 2]}`)}, wantErr: ErrBadArgument},
		{name: "coordinate string not numbers", reply: policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": "nan, 5"}`)}, wantErr: ErrBadArgument},
		{name: "unknown key", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["hyper"]}`)}, wantErr: ErrUnknownKey},
		{name: "key injection", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["ctrl'); import os; os.system('id"]}`)}, wantErr: ErrUnknownKey},
		{name: "empty combination part", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["ctrl+"]}`)}, wantErr: ErrUnknownKey},
		{name: "no keys", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": []}`)}, wantErr: ErrMissingArgument},
		{name: "keys not strings", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": [1, 2]}`)}, wantErr: ErrBadArgument},
		{name: "too many keys", reply: policy.Reply{Content: jsonCall(`{"action": "key", "keys": ["a","b","c","d","e","f","g","h","i"]}`)}, wantErr: ErrOutOfRange},
		{name: "scroll without pixels", reply: policy.Reply{Content: jsonCall(`{"action": "scroll"}`)}, wantErr: ErrMissingArgument},
		{name: "scroll too far", reply: policy.Reply{Content: jsonCall(`{"action": "scroll", "pixels": 1e9}`)}, wantErr: ErrOutOfRange},
		{name: "pixels not a number", reply: policy.Reply{Content: jsonCall(`{"action": "scroll", "pixels": "lots"}`)}, wantErr: ErrBadArgument},
		{name: "type without text", reply: policy.Reply{Content: jsonCall(`{"action": "type"}`)}, wantErr: ErrMissingArgument},
		{name: "text not a string", reply: policy.Reply{Content: jsonCall(`{"action": "type", "text": 5}`)}, wantErr: ErrBadArgument},
		{name: "text too long", reply: policy.Reply{Content: jsonCall(`{"action": "type", "text": "` + strings.Repeat("a", MaxTextLen+1) + `"}`)}, wantErr: ErrOutOfRange},
		{name: "bad status", reply: policy.Reply{Content: jsonCall(`{"action": "terminate", "status": "maybe"}`)}, wantErr: ErrBadArgument},
		{name: "negative wait", reply: policy.Reply{Content: jsonCall(`{"action": "wait", "time": -1}`)}, wantErr: ErrOutOfRange},
		{name: "xml duplicate parameter", reply: policy.Reply{Content: xmlCall("action", "wait", "action", "terminate")}, wantErr: ErrSyntax},
		{name: "xml text outside parameters", reply: policy.Reply{Content: "<function=computer_use>\nclick it\n</function>"}, wantErr: ErrSyntax},
		{name: "second call bad: nothing runs", reply: policy.Reply{Content: "Action: Two things.\n" + jsonCall(`{"action": "wait"}`) + jsonCall(`{"action": "fly"}`)}, wantSummary: "Two things.", wantErr: ErrUnknownAction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			screen := tt.screen
			if screen == (Screen{}) {
				screen = screen3
			}
			got := ParseReply(tt.reply, screen)
			if !errors.Is(got.Err, tt.wantErr) || (tt.wantErr == nil) != (got.Err == nil) {
				t.Fatalf("Err = %v, want %v", got.Err, tt.wantErr)
			}
			var actions []string
			for _, a := range got.Actions {
				actions = append(actions, a.String())
			}
			if diff := cmp.Diff(tt.wantActions, actions); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if tt.wantSummary != "" && got.Summary != tt.wantSummary {
				t.Errorf("Summary = %q, want %q", got.Summary, tt.wantSummary)
			}
			if len(got.Calls) != len(got.Actions) {
				t.Errorf("%d calls for %d actions", len(got.Calls), len(got.Actions))
			}
			for _, a := range got.Actions {
				if a.Kind == 0 && (a.Code == "" || strings.ContainsAny(a.Code, "\x00\r;")) {
					t.Errorf("action code %q: want non-empty, one call per line, no ; or CR", a.Code)
				}
			}
		})
	}
}

func TestParseReplyErrorSaysWhere(t *testing.T) {
	got := ParseReply(policy.Reply{Content: jsonCall(`{"action": "wait"}`) + jsonCall(`{"action": "left_click", "coordinate": [5000, 1]}`)}, screen3)
	var pe *ParseError
	if !errors.As(got.Err, &pe) {
		t.Fatalf("Err = %v, want a *ParseError", got.Err)
	}
	if pe.Call != 1 || pe.Action != ActionLeftClick {
		t.Errorf("ParseError{Call: %d, Action: %q}, want call 1 (left_click)", pe.Call, pe.Action)
	}
	if msg := got.Err.Error(); !strings.Contains(msg, "call 1 (left_click)") || !strings.Contains(msg, "5000") {
		t.Errorf("Err.Error() = %q, want it to name the call and the bad value", msg)
	}
	if len(got.Actions) != 0 || len(got.Calls) != 0 {
		t.Errorf("a reply with a bad call yielded %d actions, %d calls; want none", len(got.Actions), len(got.Calls))
	}
}

func TestParseTurn(t *testing.T) {
	reply := policy.Reply{
		Reasoning: "The server's reasoning.",
		Content:   "<think>\nMore thoughts.\n</think>\nAction: Click Save.\n" + jsonCall(`{"action": "left_click", "coordinate": [12.5, 40]}`) + "\n" + xmlCall("action", "type", "text", "\nindented\n"),
	}
	got, err := ParseTurn(reply)
	if err != nil {
		t.Fatal(err)
	}
	want := Turn{
		Summary:  "Click Save.",
		Thinking: "The server's reasoning.\nMore thoughts.",
		Calls: []Call{
			{Action: ActionLeftClick, Coordinate: []float64{12.5, 40}},
			{Action: ActionType, Text: "\nindented\n"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseTurn (-want +got):\n%s", diff)
	}
}

func TestParsedCallsJSON(t *testing.T) {
	got := ParseReply(policy.Reply{Content: jsonCall(`{"action": "left_click", "coordinate": [500, 300], "text": "ignored?"}`) + jsonCall(`{"action": "terminate", "status": "failure"}`)}, screen3)
	if got.Err != nil {
		t.Fatal(got.Err)
	}
	var calls []string
	for _, c := range got.Calls {
		calls = append(calls, string(c))
	}
	want := []string{
		`{"action":"left_click","text":"ignored?","coordinate":[500,300]}`,
		`{"action":"terminate","status":"failure"}`,
	}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("Calls (-want +got):\n%s", diff)
	}
	for _, c := range got.Calls {
		if !json.Valid(c) {
			t.Errorf("call %s is not valid JSON", c)
		}
	}
}

func TestSplitThinking(t *testing.T) {
	tests := []struct {
		name, in, wantVisible, wantThinking string
	}{
		{"none", "Action: x", "Action: x", ""},
		{"block", "<think> a </think>Action: x", "Action: x", "a"},
		{"opened by the template", "a\n</think>\nAction: x", "\nAction: x", "a"},
		{"unterminated", "Action: x<think>b", "Action: x", "b"},
		{"two blocks and a stray close", "<think>a</think>x</think>y<think>b</think>z", "xyz", "a\nb"},
		{"all before a first close is reasoning", "x</think>y", "y", "x"},
		{"empty", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vis, th := splitThinking(tt.in)
			if diff := cmp.Diff([2]string{tt.wantVisible, tt.wantThinking}, [2]string{vis, th}); diff != "" {
				t.Errorf("splitThinking(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestParseBounds(t *testing.T) {
	long := strings.Repeat("long ", 1000)
	got := ParseReply(policy.Reply{Content: "Action: " + long + "\n" + jsonCall(`{"action": "wait"}`)}, screen3)
	if n := len([]rune(got.Summary)); got.Err != nil || n != maxSummary+1 || !strings.HasSuffix(got.Summary, "…") {
		t.Errorf("summary of a %d-character line: %d characters, err %v; want %d and an ellipsis", len(long), n, got.Err, maxSummary+1)
	}
	var flood strings.Builder
	flood.WriteString("<function=computer_use>\n<parameter=action>\nwait\n</parameter>\n")
	for i := range 5000 {
		fmt.Fprintf(&flood, "<parameter=p%d>", i)
	}
	if got := ParseReply(policy.Reply{Content: flood.String()}, screen3); !errors.Is(got.Err, ErrSyntax) {
		t.Errorf("a flood of parameters: Err = %v, want ErrSyntax", got.Err)
	}
	tags := strings.Repeat("</think><tool_call>", 20000)
	if got := ParseReply(policy.Reply{Content: tags}, screen3); !errors.Is(got.Err, ErrSyntax) {
		t.Errorf("a flood of tags: Err = %v, want ErrSyntax", got.Err)
	}
}
