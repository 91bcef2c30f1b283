package qwen_test

import (
	"fmt"

	"legato/rl/policy"
	"legato/rl/policy/qwen"
)

func ExampleParseReply() {
	screen := qwen.Config{}.Screen(1920, 1080) // Qwen3-VL style: a 0–999 grid
	reply := policy.Reply{Content: `Action: Open the file and save it as final.txt.
<tool_call>
{"name": "computer_use", "arguments": {"action": "double_click", "coordinate": [500, 300]}}
</tool_call>
<tool_call>
{"name": "computer_use", "arguments": {"action": "key", "keys": ["ctrl", "shift", "s"]}}
</tool_call>
<tool_call>
{"name": "computer_use", "arguments": {"action": "type", "text": "final.txt\n"}}
</tool_call>
<tool_call>
{"name": "computer_use", "arguments": {"action": "terminate", "status": "failure"}}
</tool_call>`}

	parsed := qwen.ParseReply(reply, screen)
	fmt.Println(parsed.Summary)
	for _, a := range parsed.Actions {
		fmt.Println(a)
	}
	// Output:
	// Open the file and save it as final.txt.
	// pyautogui.doubleClick(960, 324)
	// pyautogui.hotkey('ctrl', 'shift', 's')
	// pyautogui.typewrite('final.txt')
	// pyautogui.press('enter')
	// FAIL
}

func ExampleConfig_Screen() {
	for _, style := range []qwen.Style{qwen.Qwen3VL, qwen.Qwen25VL} {
		s := qwen.Config{Style: style}.Screen(1920, 1080)
		fmt.Printf("%s: a 1920x1080 screen is sent as %dx%d\n", style, s.ImageWidth, s.ImageHeight)
	}
	// Output:
	// qwen3vl: a 1920x1080 screen is sent as 1920x1088
	// qwen25vl: a 1920x1080 screen is sent as 1316x728
}
