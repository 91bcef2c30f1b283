package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"legato/rl/schema"
)

// The request body is marshalled here, once per call, and the answer is
// decoded here, rather than through openai-go's param and response types:
// those re-validate and re-compact nested JSON at every level and decode
// every logprob by reflection, which measured 30 ms per call for a prompt of
// three screenshots and about 15 µs per generated token (see
// BenchmarkClientOverhead). openai-go still makes the call: base URL, auth,
// headers, the endpoint and the transport are its.

// chatRequest is a chat-completions request body.
type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Logprobs    bool          `json:"logprobs"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	Temperature *float64      `json:"temperature,omitempty"`
	TopP        *float64      `json:"top_p,omitempty"`
	// The ways to ask for token ids (see tokenids.go).
	ReturnTokenIDs         bool `json:"return_token_ids,omitempty"`
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids,omitempty"`
	ReturnMetaInfo         bool `json:"return_meta_info,omitempty"`
	ReturnPromptTokenIDs   bool `json:"return_prompt_token_ids,omitempty"`
}

// chatMessage is a message with its content as a plain string when it is
// one text part, which every server and chat template accepts, and as a
// list of parts otherwise.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// messages checks msgs and shapes them for the wire.
func messages(msgs []schema.Message) ([]chatMessage, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrInvalidMessages)
	}
	out := make([]chatMessage, len(msgs))
	for i, m := range msgs {
		if err := checkMessage(m); err != nil {
			return nil, fmt.Errorf("%w: message %d (%s): %v", ErrInvalidMessages, i, m.Role, err)
		}
		out[i] = chatMessage{Role: m.Role, Content: m.Content}
		if len(m.Content) == 1 && m.Content[0].Type == "text" {
			out[i].Content = m.Content[0].Text
		}
	}
	return out, nil
}

func checkMessage(m schema.Message) error {
	switch m.Role {
	case "system", "developer", "user", "assistant":
	default:
		return fmt.Errorf("unknown role %q: use system, developer, user or assistant", m.Role)
	}
	for j, p := range m.Content {
		switch p.Type {
		case "text":
		case "image_url":
			if m.Role != "user" {
				return fmt.Errorf("part %d: only user messages may hold images", j)
			}
			if p.ImageURL == nil || p.ImageURL.URL == "" {
				return fmt.Errorf("part %d: image part without a URL", j)
			}
			if strings.HasPrefix(p.ImageURL.URL, schema.ImageScheme) {
				return fmt.Errorf("part %d: image is a %s reference: load it from the run's image store as a data URL first", j, schema.ImageScheme)
			}
		default:
			return fmt.Errorf("part %d: unknown part type %q: use \"text\" or \"image_url\"", j, p.Type)
		}
	}
	return nil
}

// requestBody marshals a request; extra fields are appended to the object.
func requestBody(req chatRequest, extra map[string]any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// Servers read the JSON, not the bytes, but unescaped <tool_call> tags
	// keep bodies readable in a proxy log.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidMessages, err)
	}
	body := bytes.TrimRight(b.Bytes(), "\n")
	if len(extra) == 0 {
		return body, nil
	}
	more, err := json.Marshal(extra)
	if err != nil {
		return nil, fmt.Errorf("%w: Extra: %v", ErrInvalidConfig, err)
	}
	// {"model":…} + {"top_k":…} → {"model":…,"top_k":…}
	body = append(body[:len(body)-1], ',')
	return append(body, more[1:]...), nil
}

// chatResponse is the part of a chat completion the client reads. Pointers
// tell a null or missing field from an empty one.
type chatResponse struct {
	Choices        []chatChoice `json:"choices"`
	PromptTokenIDs *[]int64     `json:"prompt_token_ids"` // vLLM
	// Metadata is SGLang's: the version of the weights that answered.
	Metadata *struct {
		WeightVersion string `json:"weight_version"`
	} `json:"metadata"`
	Usage *struct {
		PromptTokens        int                `json:"prompt_tokens"`
		CompletionTokens    int                `json:"completion_tokens"`
		PromptTokensDetails *chatTokensDetails `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// chatTokensDetails is usage.prompt_tokens_details. The media counts are
// SGLang's (vLLM's are a multimodal_tokens object): their presence makes a
// cached_tokens of 0 mean nothing (see Client.cachedTokens).
type chatTokensDetails struct {
	CachedTokens *int            `json:"cached_tokens"`
	ImageTokens  json.RawMessage `json:"image_tokens"`
	AudioTokens  json.RawMessage `json:"audio_tokens"`
	VideoTokens  json.RawMessage `json:"video_tokens"`
}

type chatChoice struct {
	Message struct {
		Content          *string `json:"content"`
		Reasoning        *string `json:"reasoning"`         // vLLM
		ReasoningContent *string `json:"reasoning_content"` // SGLang, older vLLM
		ToolCalls        []struct {
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	Logprobs *struct {
		Content []chatTokenLogprob `json:"content"`
	} `json:"logprobs"`
	FinishReason   finishReason `json:"finish_reason"`
	TokenIDs       *[]int64     `json:"token_ids"`        // vLLM, SGLang
	PromptTokenIDs *[]int64     `json:"prompt_token_ids"` // SGLang
	MetaInfo       *struct {
		// [logprob, id, text] per generated token.
		OutputTokenLogprobs [][]json.RawMessage `json:"output_token_logprobs"`
	} `json:"meta_info"` // SGLang's return_meta_info
}

type chatTokenLogprob struct {
	Token   string      `json:"token"`
	Logprob wireLogprob `json:"logprob"`
}

// wireLogprob is a token's logprob as it came. vLLM and SGLang send a NaN
// logprob as null, and a lenient server might send "NaN" or "-Infinity" as
// strings or a number beyond float64: each is kept as not finite, not as
// the 0.0 a plain float64 would decode null into (a logprob of 0 reads as
// probability 1). A missing field is not finite either.
type wireLogprob struct {
	v      float64
	finite bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (l *wireLogprob) UnmarshalJSON(b []byte) error {
	*l = wireLogprob{}
	if string(b) == "null" {
		return nil
	}
	var v float64
	var err error
	if len(b) > 0 && b[0] == '"' {
		var text string
		if err := json.Unmarshal(b, &text); err != nil {
			return err
		}
		v, err = strconv.ParseFloat(text, 64)
	} else {
		v, err = strconv.ParseFloat(string(b), 64)
	}
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("logprob %s: not a number", b)
	}
	l.v, l.finite = v, err == nil && !math.IsNaN(v) && !math.IsInf(v, 0)
	return nil
}

// arguments returns tool-call arguments as the JSON text OpenAI sends them
// in: a string holding JSON, though some servers send the object itself.
func arguments(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// finishReason is a choice's finish_reason: a string as OpenAI sends it,
// or an object {"type": ...} as SGLang's engine keeps it internally (its
// meta_info), which a server might pass through.
type finishReason string

// UnmarshalJSON implements json.Unmarshaler.
func (f *finishReason) UnmarshalJSON(b []byte) error {
	*f = ""
	switch {
	case string(b) == "null":
		return nil
	case len(b) > 0 && b[0] == '{':
		var obj struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(b, &obj); err != nil {
			return err
		}
		*f = finishReason(obj.Type)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*f = finishReason(s)
	return nil
}

// finishAbort is the finish_reason of a generation the engine aborted
// (vLLM and SGLang): a trainer paused it to swap weights, or it was
// cancelled. Its tokens are a fragment, never a reply.
const finishAbort = "abort"

// sglangDefaultVersion is the weight_version SGLang reports until a
// trainer sets one (--weight-version, or an update of the weights): it
// says nothing about which weights answered.
const sglangDefaultVersion = "default"
