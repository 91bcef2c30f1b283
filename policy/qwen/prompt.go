package qwen

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

// Harness is the Qwen computer-use agent. It is immutable and safe for
// concurrent use; each attempt gets its own Episode.
type Harness struct {
	cfg Config // defaults applied
	err error  // from cfg.Validate, reported by every Prompt
}

var (
	_ policy.Harness   = (*Harness)(nil)
	_ policy.Describer = (*Harness)(nil)
	_ policy.Episode   = (*Episode)(nil)
)

// New returns a harness configured by cfg. New does not fail: a cfg that
// does not validate makes every Episode.Prompt return Validate's error, so
// call cfg.Validate first to report it early.
func New(cfg Config) *Harness {
	return &Harness{cfg: cfg.withDefaults(), err: cfg.Validate()}
}

// Config returns the harness's configuration with defaults filled in.
func (h *Harness) Config() Config { return h.cfg }

// Describe says what shapes the harness's prompts, the system prompt by
// its SHA-256 when it is not the built-in one.
func (h *Harness) Describe() string {
	c := h.cfg
	prompt := "built-in"
	if c.SystemPrompt != "" {
		sum := sha256.Sum256([]byte(c.SystemPrompt))
		prompt = "sha256:" + hex.EncodeToString(sum[:])
	}
	return fmt.Sprintf("qwen %s, image max %d, eviction %s, pixels %d-%d, system prompt %s",
		c.Style, c.ImageMax, c.Eviction, c.MinPixels, c.MaxPixels, prompt)
}

// NewEpisode starts the history of one attempt at task.
func (h *Harness) NewEpisode(task desktop.Task) policy.Episode {
	return &Episode{h: h, instruction: task.Instruction}
}

// Episode is the history of one attempt: the screenshots seen and the
// replies given. It is not safe for concurrent use.
type Episode struct {
	h           *Harness
	instruction string
	system      string // built at the first Prompt: Qwen25VL states the image size
	steps       []step
	screen      Screen // of the last observation
	note        string // for the next step's user message
}

// step is one model call: what it was shown and what it replied.
type step struct {
	image   string // PNG data URL; "" once evicted
	note    string // text shown above the screenshot
	reply   string // the reply as it stays in the history
	replied bool
}

// Texts of the user messages.
const (
	evictedText = "(An earlier screenshot, no longer shown.)"
	taskFormat  = "Your task:\n%s\n\nThis is the screen now."
	noteFormat  = "Your previous reply did nothing: %s. Reply with an Action: line and <tool_call> blocks as described."
)

// Prompt returns the messages of the next model call: the system prompt,
// the task and first screenshot, then each earlier reply followed by the
// next screenshot, ending with obs. The result extends the previous
// Prompt's result by exactly the previous reply and obs, except when more
// than ImageMax screenshots would be shown: then the oldest are replaced
// by a text placeholder, as Config.Eviction says.
//
// A Prompt that follows a Prompt with no Reply in between (the model call
// failed) replaces that observation with obs.
func (e *Episode) Prompt(obs desktop.Observation) ([]schema.Message, error) {
	if e.h.err != nil {
		return nil, e.h.err
	}
	if strings.TrimSpace(e.instruction) == "" {
		return nil, errors.New("qwen prompt: the task has no instruction: nothing to ask the model")
	}
	if len(obs.Screenshot) == 0 {
		return nil, errors.New("qwen prompt: the observation has no screenshot")
	}
	cfg, err := pngConfig(obs.Screenshot)
	if err != nil {
		return nil, fmt.Errorf("qwen prompt: %w", err)
	}
	screen := e.h.cfg.Screen(cfg.Width, cfg.Height)
	if obs.Width > 0 && obs.Height > 0 {
		// pyautogui's coordinates are the screen's, even when the
		// screenshot has more pixels (HiDPI).
		screen.Width, screen.Height = obs.Width, obs.Height
	}
	url, err := screenshotURL(obs.Screenshot, cfg, screen)
	if err != nil {
		return nil, fmt.Errorf("qwen prompt: %w", err)
	}

	if n := len(e.steps); n > 0 && !e.steps[n-1].replied {
		e.steps[n-1].image = url
	} else {
		e.steps = append(e.steps, step{image: url, note: e.note})
		e.note = ""
	}
	e.screen = screen
	if e.system == "" {
		e.system = e.h.cfg.SystemPrompt
	}
	if e.system == "" {
		e.system = systemPrompt(e.h.cfg.Style, screen)
	}
	e.evict()
	return e.messages(), nil
}

// evict drops the oldest screenshots once more than ImageMax are shown, as
// Config.Eviction says. A dropped screenshot is never shown again, so its
// memory is let go.
func (e *Episode) evict() {
	shown := 0
	for _, s := range e.steps {
		if s.image != "" {
			shown++
		}
	}
	limit := e.h.cfg.ImageMax
	if shown <= limit {
		return
	}
	drop := shown - limit
	if e.h.cfg.Eviction == EvictHalf {
		drop = max(drop, limit/2)
	}
	for i := range e.steps {
		if drop == 0 {
			break
		}
		if e.steps[i].image != "" {
			e.steps[i].image = ""
			drop--
		}
	}
}

// messages builds the prompt from the history. Every call builds new
// Parts, so callers may rewrite them (image URLs into references) freely.
func (e *Episode) messages() []schema.Message {
	msgs := make([]schema.Message, 0, 1+2*len(e.steps))
	msgs = append(msgs, schema.Message{Role: "system", Content: []schema.Part{schema.TextPart(e.system)}})
	for i, s := range e.steps {
		parts := make([]schema.Part, 0, 3)
		if i == 0 {
			parts = append(parts, schema.TextPart(fmt.Sprintf(taskFormat, e.instruction)))
		}
		if s.note != "" {
			parts = append(parts, schema.TextPart(s.note))
		}
		if s.image != "" {
			parts = append(parts, schema.ImagePart(s.image))
		} else {
			parts = append(parts, schema.TextPart(evictedText))
		}
		msgs = append(msgs, schema.Message{Role: "user", Content: parts})
		if s.replied {
			msgs = append(msgs, schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(s.reply)}})
		}
	}
	return msgs
}

// Reply adds the model's reply to the history and parses it for the screen
// of the last observation. The history keeps the reply's content verbatim,
// so the next prompt starts with the very tokens the model produced; when
// the server parsed the tool calls out of the content, they are written
// back as <tool_call> blocks.
func (e *Episode) Reply(r policy.Reply) policy.Parsed {
	n := len(e.steps)
	if n == 0 || e.steps[n-1].replied {
		return policy.Parsed{Err: fmt.Errorf("qwen: %w", ErrNoPrompt)}
	}
	p := ParseReply(r, e.screen)
	e.steps[n-1].reply = historyText(r)
	e.steps[n-1].replied = true
	if p.Err != nil {
		why := p.Err.Error()
		var pe *ParseError
		if errors.As(p.Err, &pe) {
			why = pe.detail()
		}
		e.note = fmt.Sprintf(noteFormat, why)
	}
	return p
}

// historyText is a reply as the history keeps it.
func historyText(r policy.Reply) string {
	if len(r.ToolCalls) == 0 {
		return r.Content
	}
	var b strings.Builder
	b.WriteString(r.Content)
	for _, tc := range r.ToolCalls {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		args := strings.TrimSpace(tc.Arguments)
		if !json.Valid([]byte(args)) {
			args = string(mustJSON(args))
		}
		fmt.Fprintf(&b, "%s\n{\"name\": %s, \"arguments\": %s}\n%s", toolCallOpen, mustJSON(tc.Name), args, toolCallClose)
	}
	return b.String()
}

// mustJSON marshals a value that cannot fail to marshal (a string, the
// tool schema), without escaping <, > and &.
func mustJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(fmt.Sprintf("qwen: marshal %T: %v", v, err))
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// systemPrompt declares the computer_use tool and the reply format.
func systemPrompt(style Style, screen Screen) string {
	tool := toolSpec(style, screen)
	return "You operate a computer to carry out a user's task. Every turn shows you the screen; you reply with what to do next.\n" +
		"\n" +
		"# Tools\n" +
		"\n" +
		"The functions you may call are described in JSON inside <tools></tools>:\n" +
		"<tools>\n" + string(mustJSON(tool)) + "\n</tools>\n" +
		"\n" +
		"To call a function, write a JSON object with its name and its arguments between <tool_call> and </tool_call>:\n" +
		"<tool_call>\n" +
		`{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}}` + "\n" +
		"</tool_call>\n" +
		"\n" +
		"# Reply format\n" +
		"\n" +
		"Each reply has two parts, and nothing else:\n" +
		"1. A line that starts with \"Action:\" and says in one short sentence what you do next.\n" +
		"2. One or more <tool_call> blocks, carried out in the order written.\n" +
		"\n" +
		"When the task is done, call terminate with status \"success\". When it cannot be done, call terminate with status \"failure\"."
}

// tool is the JSON schema of the computer_use function.
type tool struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Parameters  toolParams `json:"parameters"`
}

type toolParams struct {
	Type       string     `json:"type"`
	Properties toolFields `json:"properties"`
	Required   []string   `json:"required"`
}

// toolFields is a struct rather than a map so the fields keep their order.
type toolFields struct {
	Action     field `json:"action"`
	Keys       field `json:"keys"`
	Text       field `json:"text"`
	Coordinate field `json:"coordinate"`
	Pixels     field `json:"pixels"`
	Time       field `json:"time"`
	Status     field `json:"status"`
}

type field struct {
	Description string   `json:"description,omitempty"`
	Type        string   `json:"type"`
	Enum        []string `json:"enum,omitempty"`
	Items       *field   `json:"items,omitempty"`
}

func toolSpec(style Style, screen Screen) tool {
	coords := "* Coordinates are [x, y] on a grid from 0 to 999 laid over the screenshot, whatever its size: [0, 0] is the top-left corner and [999, 999] the bottom-right corner."
	if style == Qwen25VL {
		coords = fmt.Sprintf("* Coordinates are [x, y] in pixels of the screenshot, which is %dx%d: [0, 0] is the top-left corner and [%d, %d] the bottom-right corner.",
			screen.ImageWidth, screen.ImageHeight, screen.ImageWidth-1, screen.ImageHeight-1)
	}
	description := strings.Join([]string{
		"Work the computer's mouse and keyboard. After each step you get a new screenshot of the screen.",
		coords,
		"* Find an element on the latest screenshot before you point at it, and aim at its middle, not its edge.",
		"* Programs can be slow to open or to react. If nothing seems to have happened, wait and look at the next screenshot before trying again.",
	}, "\n")
	actionHelp := strings.Join([]string{
		"What to do:",
		"* `key`: press the keys in `keys` together, as a shortcut (`[\"ctrl\", \"s\"]`) or one key (`[\"enter\"]`).",
		"* `type`: type `text` where the keyboard focus is; a line break presses Enter.",
		"* `mouse_move`: move the pointer to `coordinate`.",
		"* `left_click`: click the left button at `coordinate`.",
		"* `left_click_drag`: hold the left button down, move from where the pointer is to `coordinate`, and let go.",
		"* `right_click`: click the right button at `coordinate`.",
		"* `middle_click`: click the middle button at `coordinate`.",
		"* `double_click`: double-click the left button at `coordinate`.",
		"* `triple_click`: triple-click the left button at `coordinate`, to select a whole line or paragraph.",
		"* `scroll`: turn the scroll wheel by `pixels`, up when positive and down when negative, over `coordinate` if given.",
		"* `hscroll`: scroll sideways by `pixels`, right when positive and left when negative, over `coordinate` if given.",
		"* `wait`: let `time` seconds pass while the screen changes.",
		"* `terminate`: stop, with `status` \"success\" when the task is done or \"failure\" when it cannot be done.",
		"* `answer`: give `text` as the answer, when the task asks a question.",
	}, "\n")
	return tool{
		Type: "function",
		Function: toolFunction{
			Name:        ToolName,
			Description: description,
			Parameters: toolParams{
				Type: "object",
				Properties: toolFields{
					Action:     field{Description: actionHelp, Type: "string", Enum: actions()},
					Keys:       field{Description: "Keys for `key`, named as pyautogui names them: enter, esc, tab, backspace, delete, ctrl, shift, alt, up, down, pageup, home, f5, a, 1, ...", Type: "array", Items: &field{Type: "string"}},
					Text:       field{Description: "Text for `type` and `answer`.", Type: "string"},
					Coordinate: field{Description: "[x, y] for mouse actions, on the scale given above.", Type: "array", Items: &field{Type: "number"}},
					Pixels:     field{Description: "How far `scroll` and `hscroll` go.", Type: "number"},
					Time:       field{Description: "Seconds for `wait`.", Type: "number"},
					Status:     field{Description: "How `terminate` ends the task.", Type: "string", Enum: []string{"success", "failure"}},
				},
				Required: []string{"action"},
			},
		},
	}
}
