package qwen

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/policy"
)

// FuzzParseReply feeds the parser arbitrary replies. It must never panic,
// and every reply either fails to parse (and yields no actions) or yields
// code that passes the stub check: the shape check, then a run against the
// stub pyautogui that records exactly the intended calls, typing exactly
// the intended text.
func FuzzParseReply(f *testing.F) {
	for _, tt := range adversarialTexts[:len(adversarialTexts)-2] {
		for _, format := range replyFormats {
			r := format.reply(tt.text)
			args := ""
			if len(r.ToolCalls) > 0 {
				args = r.ToolCalls[0].Arguments
			}
			f.Add(r.Content, args, false)
		}
	}
	for n := 1; n <= 6; n++ {
		f.Add(scriptedReply(n).Content, "", n%2 == 0)
	}
	f.Add(jsonCall(`{"action": "left_click", "coordinate": [500, 300]}`)+xmlCall("action", "key", "keys", "ctrl+alt+t"), "", true)
	f.Add(xmlCall("action", "scroll", "pixels", "-3", "coordinate", "(10, 999)"), "", false)
	f.Add("<think>x</think>"+jsonCall(`{"action": "drag", "coordinate": [1, 2]}`), "", false)
	f.Add("", `{"action": "left_click_drag", "coordinate": "[12.5, 7]"}`, true)
	f.Add("<tool_call>\n<function=computer_use>\n<parameter=action>\ntype\n</parameter>\n<parameter=text>\nq'\\x00", "", false)

	checker := startChecker(f)
	f.Fuzz(func(t *testing.T, content, args string, qwen25 bool) {
		reply := policy.Reply{Content: content}
		if args != "" {
			reply.ToolCalls = []policy.ToolCall{{Name: ToolName, Arguments: args}}
		}
		screen := screen3
		if qwen25 {
			screen = screen25
		}
		got := ParseReply(reply, screen)
		if got.Err != nil {
			if len(got.Actions) != 0 || len(got.Calls) != 0 {
				t.Fatalf("a reply that did not parse (%v) yielded %d actions", got.Err, len(got.Actions))
			}
			return
		}
		turn, err := ParseTurn(reply)
		if err != nil || len(turn.Calls) != len(got.Actions) || len(got.Calls) != len(got.Actions) {
			t.Fatalf("ParseTurn: %d calls, %v; ParseReply: %d actions, %d calls", len(turn.Calls), err, len(got.Actions), len(got.Calls))
		}
		for i, a := range got.Actions {
			var call Call
			if err := json.Unmarshal(got.Calls[i], &call); err != nil {
				t.Fatalf("call %d: %s: %v", i, got.Calls[i], err)
			}
			if a.Kind != desktop.Code {
				if !map[string]bool{ActionWait: true, ActionAnswer: true, ActionTerminate: true}[call.Action] {
					t.Fatalf("call %d (%s) became %v", i, call.Action, a)
				}
				continue
			}
			for j, r := range a.Code {
				if r != '\n' && (r < 0x20 || r >= 0x7f) {
					t.Fatalf("code has %U at byte %d: want printable ASCII only", r, j)
				}
			}
			res, err := checker.check(a.Code)
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK {
				t.Fatalf("stub check of %q: %s", truncate(a.Code, 300), res.Error)
			}
			prog, _, err := turn.Calls[i].compile(screen)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(stubCalls(t, prog), res.Calls); diff != "" {
				t.Fatalf("recorded calls (-want +got):\n%s", truncate(diff, 2000))
			}
			if call.Action == ActionType {
				want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(turn.Calls[i].Text)
				if got := typed(res.Calls); got != want {
					t.Fatalf("typed %q, want %q", truncate(got, 200), truncate(want, 200))
				}
			}
		}
	})
}
