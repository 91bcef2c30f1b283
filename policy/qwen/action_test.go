package qwen

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/policy"
)

// adversarialTexts are things a model might type that would break naive
// code generation.
var adversarialTexts = []struct{ name, text string }{
	{"plain", "hello world"},
	{"single quote injection", "'); import os; os.system('touch /tmp/pwned'); ('"},
	{"double quote injection", `"); import os; os.system("id"); ("`},
	{"escaped quote injection", `\'); __import__('os').system('id'); (\'`},
	{"backslashes", `C:\new\table\x41\u0041\N{BULLET}\`},
	{"trailing backslash", `end\`},
	{"triple quotes", `''' """ '''`},
	{"newlines", "line1\nline2\r\nline3\rline4\n"},
	{"only newlines", "\n\n"},
	{"control characters", "tab\there\x00nul\x1b[31mesc\x7fdel\x0bvt\x0cff"},
	{"unicode", "héllo wörld — 日本語 😀 \u202eRTL\u202c \u2028sep\ufeff ß"},
	{"format braces", "{os.system('id')} %s %(x)s {{}}"},
	{"shell syntax", "$(id) `id` ${HOME}; rm -rf / && echo | cat > /etc/passwd"},
	{"python comment", "# nothing\n'''\nimport os"},
	{"very long", strings.Repeat("a'\\\n😀\"", 1300)},
	{"longest allowed", strings.Repeat("😀", MaxTextLen)},
}

// replyFormats writes a type call for text in each format a reply can use.
var replyFormats = []struct {
	name  string
	reply func(text string) policy.Reply
}{
	{"json", func(text string) policy.Reply {
		js, _ := json.Marshal(text)
		return policy.Reply{Content: "Action: Type it.\n" + jsonCall(`{"action": "type", "text": `+string(js)+`}`)}
	}},
	{"xml", func(text string) policy.Reply {
		return policy.Reply{Content: "Action: Type it.\n" + xmlCall("action", "type", "text", text)}
	}},
	{"openai", func(text string) policy.Reply {
		args, _ := json.Marshal(map[string]string{"action": "type", "text": text})
		return policy.Reply{Content: "Action: Type it.", ToolCalls: []policy.ToolCall{{Name: "computer_use", Arguments: string(args)}}}
	}},
}

// TestAdversarialTextRunsInGuest checks, for text that tries to escape its
// string literal, that the generated code passes the shape check and, run
// by a real python3 -c against the stub pyautogui, types exactly the
// intended text and does nothing else.
func TestAdversarialTextRunsInGuest(t *testing.T) {
	checker := startChecker(t)
	for _, tt := range adversarialTexts {
		// Every format yields the same program; run each program once.
		ran := map[string][]stubCall{}
		for _, f := range replyFormats {
			t.Run(tt.name+"/"+f.name, func(t *testing.T) {
				got := ParseReply(f.reply(tt.text), screen3)
				if got.Err != nil {
					t.Fatalf("ParseReply: %v", got.Err)
				}
				if len(got.Actions) != 1 || got.Actions[0].Kind != desktop.Code {
					t.Fatalf("actions = %v, want one code action", got.Actions)
				}
				code := got.Actions[0].Code
				for i, r := range code {
					if r != '\n' && (r < 0x20 || r >= 0x7f) {
						t.Fatalf("code has %U at byte %d: want printable ASCII only", r, i)
					}
				}
				checkShape(t, checker, code)
				calls, ok := ran[code]
				if !ok {
					calls = runGuest(t, code)
					ran[code] = calls
				}

				want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(strings.ToValidUTF8(tt.text, "\uFFFD"))
				if got := typed(calls); got != want {
					t.Errorf("typed text differs:\n got %q\nwant %q", truncate(got, 300), truncate(want, 300))
				}
				prog, err := typeProgram(tt.text)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(stubCalls(t, prog), calls); diff != "" {
					t.Errorf("recorded calls (-want +got):\n%s", truncate(diff, 2000))
				}
			})
		}
	}
}

// TestEveryActionRunsInGuest runs the code of every action that has code
// against the stub, comparing the recorded calls with the intended ones.
func TestEveryActionRunsInGuest(t *testing.T) {
	checker := startChecker(t)
	tests := []struct {
		name string
		call Call
		want []stubCall
	}{
		{"key combo", Call{Action: ActionKey, Keys: []string{"ctrl", "alt", "t"}}, []stubCall{{"hotkey", []any{"ctrl", "alt", "t"}, map[string]any{}}}},
		{"key quote", Call{Action: ActionKey, Keys: []string{"'"}}, []stubCall{{"press", []any{"'"}, map[string]any{}}}},
		{"key backslash", Call{Action: ActionKey, Keys: []string{"\\"}}, []stubCall{{"press", []any{"\\"}, map[string]any{}}}},
		{"key newline", Call{Action: ActionKey, Keys: []string{"\n"}}, []stubCall{{"press", []any{"\n"}, map[string]any{}}}},
		{"type lines", Call{Action: ActionType, Text: "a\nb"}, []stubCall{{"typewrite", []any{"a"}, map[string]any{}}, {"press", []any{"enter"}, map[string]any{}}, {"typewrite", []any{"b"}, map[string]any{}}}},
		{"mouse_move corner", Call{Action: ActionMouseMove, Coordinate: []float64{999, 0}}, []stubCall{{"moveTo", []any{1919.0, 0.0}, map[string]any{}}}},
		{"left_click", Call{Action: ActionLeftClick, Coordinate: []float64{500, 300}}, []stubCall{{"click", []any{960.0, 324.0}, map[string]any{}}}},
		{"left_click at pointer", Call{Action: ActionLeftClick}, []stubCall{{"click", []any{}, map[string]any{}}}},
		{"left_click_drag", Call{Action: ActionLeftClickDrag, Coordinate: []float64{500, 300}}, []stubCall{{"dragTo", []any{960.0, 324.0}, map[string]any{"duration": 0.5}}}},
		{"right_click", Call{Action: ActionRightClick, Coordinate: []float64{1, 1}}, []stubCall{{"rightClick", []any{1.0, 1.0}, map[string]any{}}}},
		{"middle_click", Call{Action: ActionMiddleClick, Coordinate: []float64{1, 1}}, []stubCall{{"middleClick", []any{1.0, 1.0}, map[string]any{}}}},
		{"double_click", Call{Action: ActionDoubleClick, Coordinate: []float64{1, 1}}, []stubCall{{"doubleClick", []any{1.0, 1.0}, map[string]any{}}}},
		{"triple_click", Call{Action: ActionTripleClick, Coordinate: []float64{1, 1}}, []stubCall{{"tripleClick", []any{1.0, 1.0}, map[string]any{}}}},
		{"scroll", Call{Action: ActionScroll, Pixels: -7}, []stubCall{{"scroll", []any{-7.0}, map[string]any{}}}},
		{"scroll at point", Call{Action: ActionScroll, Pixels: 2, Coordinate: []float64{500, 300}}, []stubCall{{"scroll", []any{2.0}, map[string]any{"x": 960.0, "y": 324.0}}}},
		{"hscroll", Call{Action: ActionHScroll, Pixels: -1}, []stubCall{{"hscroll", []any{-1.0}, map[string]any{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := tt.call.Pyautogui(screen3)
			if err != nil {
				t.Fatal(err)
			}
			checkShape(t, checker, a.Code)
			if diff := cmp.Diff(tt.want, runGuest(t, a.Code)); diff != "" {
				t.Errorf("recorded calls for %s (-want +got):\n%s", a.Code, diff)
			}
		})
	}
}

func TestSpecialActions(t *testing.T) {
	tests := []struct {
		name string
		call Call
		want desktop.Action
	}{
		{"wait", Call{Action: ActionWait}, desktop.WaitAction},
		{"wait with time", Call{Action: ActionWait, Time: 3}, desktop.WaitAction},
		{"terminate success", Call{Action: ActionTerminate, Status: "success"}, desktop.DoneAction},
		{"terminate failure", Call{Action: ActionTerminate, Status: "Failure"}, desktop.FailAction},
		{"terminate without status", Call{Action: ActionTerminate}, desktop.DoneAction},
		{"answer", Call{Action: ActionAnswer, Text: "Paris"}, desktop.WaitAction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call.Pyautogui(screen3)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Pyautogui() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTextTooLongForOneAction(t *testing.T) {
	for _, text := range []string{strings.Repeat("x", MaxTextLen+1), strings.Repeat("😀", 100000)} {
		_, err := Call{Action: ActionType, Text: text}.Pyautogui(screen3)
		if !errors.Is(err, ErrOutOfRange) {
			t.Errorf("type of %d characters: err = %v, want ErrOutOfRange", utf8.RuneCountInString(text), err)
		}
	}
}

// TestPyStringRoundTrip checks pyString on every Unicode plane's edges and
// on invalid UTF-8: Python must read back exactly the (valid) string.
func TestPyStringRoundTrip(t *testing.T) {
	var texts []string
	var b strings.Builder
	for r := rune(0); r < 0x300; r++ {
		b.WriteRune(r)
	}
	texts = append(texts, b.String())
	texts = append(texts, "\uD7FF\uE000\uFFFD\uFFFF\U00010000\U0010FFFF", "bad \xff\xfe utf8 \xc3", "")
	var prog program
	for _, s := range texts {
		prog = append(prog, pyCall{Fn: "typewrite", Args: []any{s}})
	}
	calls := runGuest(t, prog.String())
	if len(calls) != len(texts) {
		t.Fatalf("%d calls recorded, want %d", len(calls), len(texts))
	}
	for i, s := range texts {
		// Each invalid byte reads as one U+FFFD, as Go's range does.
		want := strings.Map(func(r rune) rune { return r }, s)
		if got := calls[i].Args[0]; got != want {
			t.Errorf("text %d: python read %q, want %q", i, truncate(fmt.Sprint(got), 80), truncate(want, 80))
		}
	}
}
