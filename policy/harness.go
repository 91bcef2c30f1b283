package policy

import (
	"encoding/json"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// Harness is the agent around the model: it turns observations into prompts
// and the model's replies into desktop actions. The Qwen computer-use
// harness (package policy/qwen) is the default; users may bring their own.
type Harness interface {
	// NewEpisode starts the history of one attempt at task.
	NewEpisode(task desktop.Task) Episode
}

// Describer is implemented by harnesses that can say what shapes their
// prompts (model family, image budget, system prompt, ...). Collect records
// the description in batch.json, so that continuing a batch with a harness
// that would prompt differently is refused.
type Describer interface {
	Describe() string
}

// Episode holds the history of one attempt. It is not safe for concurrent
// use.
type Episode interface {
	// Prompt returns the messages of the next model call: the system
	// prompt, the task's instruction, the history so far, and obs. Images
	// are PNG data URLs.
	Prompt(obs desktop.Observation) ([]schema.Message, error)
	// Reply adds the model's reply to the history and parses it into
	// actions for the screen of the last observation. A reply that does not
	// parse is not an error: it yields no actions and Parsed.Err says why.
	Reply(reply Reply) Parsed
}

// Reply is the part of a model response a harness reads.
type Reply struct {
	Content   string
	Reasoning string
	// ToolCalls are the OpenAI tool calls, when the server parsed them.
	ToolCalls []ToolCall
}

// ToolCall is one OpenAI-style function call.
type ToolCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Parsed is a reply turned into actions.
type Parsed struct {
	// Actions are sent to the desktop in order.
	Actions []desktop.Action
	// Calls are the parsed tool calls, one per action, as JSON.
	Calls []json.RawMessage
	// Summary is the reply's short description of what it does.
	Summary string
	// Err is non-nil when the reply did not parse; Actions is then empty.
	Err error
}
