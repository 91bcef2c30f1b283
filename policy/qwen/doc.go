// Package qwen is legato's default agent harness: a computer-use agent that
// speaks the conventions of Qwen's vision-language models and of OSWorld's
// Qwen agent, so that a Qwen model served by vLLM or SGLang can drive an
// OSWorld desktop without any adaptation.
//
// # Prompt
//
// The built-in system prompt (Config.SystemPrompt replaces it) declares one
// function tool, computer_use, with the actions key, type, mouse_move,
// left_click, left_click_drag, right_click, middle_click, double_click,
// triple_click, scroll, hscroll, wait, terminate and answer, and asks for a
// reply made of one "Action:" summary line and one or more <tool_call>
// blocks. The first user message carries the task's
// instruction and the first screenshot; every later step adds the model's
// reply (verbatim) and a user message with the next screenshot. So while
// fewer than Config.ImageMax screenshots exist, the prompt of step n+1 is
// the prompt of step n plus two messages, byte for byte, and the model
// server's prefix cache serves the whole history. Past ImageMax, the oldest
// screenshots are replaced by a short text placeholder, by default half of
// them at once (EvictHalf), so that the prompt changes near its start only
// every ImageMax/2 steps rather than at every step and the prefix cache
// keeps serving the history in between. When a reply does not parse, the
// next user message says why, above the screenshot.
//
// Screenshots are resized with Qwen's smart-resize rule (SmartResize) and
// sent as PNG data URLs; each one is encoded once and reused for the rest
// of the episode.
//
// # Replies
//
// A reply's calls are read from <tool_call>{json}</tool_call> blocks in the
// content (several allowed, the last may be unterminated), from the XML
// style <function=computer_use><parameter=action>…</parameter></function>
// of newer Qwen models, or from OpenAI tool_calls when the server parsed
// them. Text inside <think> is reasoning and never yields actions. A reply
// that does not parse yields no actions and an error that wraps one of the
// sentinels below; it never panics.
//
// # Actions
//
// Each call becomes one desktop.Action: pyautogui code for OSWorld's guest,
// or WAIT, DONE, FAIL. Coordinates are mapped back to the real screen: from
// the 0–999 grid for Qwen3-VL style (the default), or from pixels of the
// resized screenshot for Qwen2.5-VL style. Differences from OSWorld's agent,
// on purpose:
//   - terminate with status "failure" is FAIL (OSWorld's agent always said
//     DONE and so scored 0 on every infeasible task); "success" or no status
//     is DONE.
//   - answer is WAIT: OSWorld has no channel for answers (its evaluators
//     read the desktop) and its agent emits no code for answer, so the step
//     does nothing; WAIT records that explicitly and the text stays in the
//     recorded call.
//   - wait is WAIT whatever its time: the worker's own wait after each
//     action (ready signal or fixed) does the waiting.
//   - triple_click is pyautogui.tripleClick, not a double click.
//   - type splits the text at line breaks and presses Enter for each one.
//   - a click without a coordinate clicks where the pointer is, as in
//     OSWorld's agent; mouse_move and left_click_drag without one do not
//     parse.
//
// # Safety
//
// The model's text reaches the guest only inside Python string literals
// built by pyString, which escapes every character that is not printable
// ASCII, so no reply can end the literal early. Key names come only from
// pyautogui's own list of key names. Every generated program is a sequence
// of pyautogui.<function>(<literals>) calls and nothing else.
package qwen
