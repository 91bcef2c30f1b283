package policytest

import (
	"fmt"
	"strings"

	"legato/rl/schema"
)

// Request is a chat-completions request as the script and the fault
// schedule see it.
type Request struct {
	// N is the request's arrival index on this server, from 0.
	N int
	// Model is the model the request named.
	Model    string
	Messages []schema.Message
	// Instruction is the text of the first user message.
	Instruction string
	// Step is the number of assistant messages in the prompt: 0 for the
	// first call of an attempt.
	Step int
	// Images counts the image parts of the prompt.
	Images int
	// Fields are the top-level fields of the request body, sorted.
	Fields []string
	// Logprobs and ReturnTokenIDs report whether the request asked for
	// them; ReturnTokensAsTokenIDs, ReturnMetaInfo and
	// ReturnPromptTokenIDs whether it asked for vLLM's and SGLang's other
	// ways to get ids.
	Logprobs               bool
	ReturnTokenIDs         bool
	ReturnTokensAsTokenIDs bool
	ReturnMetaInfo         bool
	ReturnPromptTokenIDs   bool
	// MaxTokens is max_tokens or max_completion_tokens; 0 when unset.
	MaxTokens int
	// Temperature and TopP are the sampling knobs sent; nil when unset.
	Temperature, TopP *float64
	// Authorized reports whether the request carried a bearer token.
	Authorized bool
}

func newRequest(n int, model string, msgs []schema.Message) Request {
	req := Request{N: n, Model: model, Messages: msgs}
	for _, m := range msgs {
		switch m.Role {
		case "assistant":
			req.Step++
		case "user":
			if req.Instruction == "" {
				req.Instruction = textOf(m)
			}
		}
		for _, p := range m.Content {
			if p.ImageURL != nil {
				req.Images++
			}
		}
	}
	return req
}

func textOf(m schema.Message) string {
	var b strings.Builder
	for _, p := range m.Content {
		if p.ImageURL == nil {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// DefaultScript plays a Qwen-style computer-use agent: it answers each step
// with one computer_use tool call in <tool_call> tags, a few left_click,
// type and key actions, then terminate. Everything is derived from the
// instruction and the step, so a task always gets the same replies: one
// task in five ends with status "failure", one in three types text on its
// second step. Coordinates are on Qwen3-VL's 0–999 grid.
func DefaultScript(req Request) string {
	h := hashString(req.Instruction)
	steps := 1 + int(h%4)
	if req.Step >= steps {
		if h%5 == 0 {
			return toolCall("The task cannot be completed.", `{"action": "terminate", "status": "failure"}`)
		}
		return toolCall("The task is done.", `{"action": "terminate", "status": "success"}`)
	}
	s := uint64(req.Step)
	switch {
	case req.Step == 1 && h%3 == 0:
		return toolCall("Type the text.", `{"action": "type", "text": "hello from legato"}`)
	case (h>>4+s)%4 == 3:
		return toolCall("Save with the keyboard.", `{"action": "key", "keys": ["ctrl", "s"]}`)
	default:
		x, y := mix(h, s)%1000, mix(h, s+100)%1000
		return toolCall(fmt.Sprintf("Click at (%d, %d).", x, y),
			fmt.Sprintf(`{"action": "left_click", "coordinate": [%d, %d]}`, x, y))
	}
}

func toolCall(summary, args string) string {
	return "Action: " + summary + "\n<tool_call>\n" +
		`{"name": "computer_use", "arguments": ` + args + "}\n</tool_call>"
}
