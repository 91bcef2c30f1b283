package policytest

import (
	"fmt"
	"math/rand/v2"
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

// SampledScript is DefaultScript's agent with its choices drawn instead of
// derived from the instruction: each reply is drawn from seed and the
// request's arrival index, so the attempts of a group differ, as a sampled
// model's do (a GRPO group of identical attempts has no gradient), and a
// server given the same seed answers its n-th request the same. A step
// ends the attempt with probability 1/3 (at the fifth step always; one
// end in five with status "failure"); otherwise it clicks anywhere on the
// 0–999 grid (four steps in six), types or presses a key.
func SampledScript(seed uint64) func(Request) string {
	return func(req Request) string {
		r := rand.New(rand.NewPCG(seed, mix(uint64(req.N), 0x5a3d)))
		if req.Step >= 4 || (req.Step > 0 && r.IntN(3) == 0) {
			if r.IntN(5) == 0 {
				return toolCall("The task cannot be completed.", `{"action": "terminate", "status": "failure"}`)
			}
			return toolCall("The task is done.", `{"action": "terminate", "status": "success"}`)
		}
		switch r.IntN(6) {
		case 0:
			return toolCall("Type the text.", `{"action": "type", "text": "hello from legato"}`)
		case 1:
			return toolCall("Save with the keyboard.", `{"action": "key", "keys": ["ctrl", "s"]}`)
		}
		x, y := r.IntN(1000), r.IntN(1000)
		return toolCall(fmt.Sprintf("Click at (%d, %d).", x, y),
			fmt.Sprintf(`{"action": "left_click", "coordinate": [%d, %d]}`, x, y))
	}
}

func toolCall(summary, args string) string {
	return "Action: " + summary + "\n<tool_call>\n" +
		`{"name": "computer_use", "arguments": ` + args + "}\n</tool_call>"
}
