package policytest

import (
	"encoding/json"
	"fmt"
	"slices"

	"legato/rl/schema"
)

// openAIFields are the request fields the OpenAI dialect accepts.
var openAIFields = map[string]bool{
	"model": true, "messages": true, "logprobs": true, "top_logprobs": true,
	"max_tokens": true, "max_completion_tokens": true, "temperature": true,
	"top_p": true, "n": true, "stop": true, "seed": true, "tools": true,
	"tool_choice": true, "parallel_tool_calls": true, "stream": true,
	"stream_options": true, "presence_penalty": true, "frequency_penalty": true,
	"logit_bias": true, "user": true, "response_format": true,
	"reasoning_effort": true, "metadata": true, "store": true,
	"service_tier": true, "modalities": true, "prediction": true,
	"prompt_cache_key": true, "safety_identifier": true, "verbosity": true,
}

// wireRequest is the part of a request body the server reads.
type wireRequest struct {
	Model    string
	Messages []schema.Message
	Fields   []string
	// raw is the body's fields, which a validation error echoes.
	raw map[string]json.RawMessage

	Logprobs               bool
	ReturnTokenIDs         bool
	ReturnTokensAsTokenIDs bool
	ReturnMetaInfo         bool
	ReturnPromptTokenIDs   bool
	MaxTokens              int
	Temperature, TopP      *float64
	Stream                 bool
}

func parseRequest(body []byte) (wireRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return wireRequest{}, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	wr := wireRequest{raw: fields}
	for k := range fields {
		wr.Fields = append(wr.Fields, k)
	}
	slices.Sort(wr.Fields)
	get := func(name string, dst any) error {
		raw, ok := fields[name]
		if !ok || string(raw) == "null" {
			return nil
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("field %s: %v", name, err)
		}
		return nil
	}
	var msgs []wireMessageIn
	var maxTokens, maxCompletion int
	for _, err := range []error{
		get("model", &wr.Model),
		get("messages", &msgs),
		get("logprobs", &wr.Logprobs),
		get("return_token_ids", &wr.ReturnTokenIDs),
		get("return_tokens_as_token_ids", &wr.ReturnTokensAsTokenIDs),
		get("return_meta_info", &wr.ReturnMetaInfo),
		get("return_prompt_token_ids", &wr.ReturnPromptTokenIDs),
		get("max_tokens", &maxTokens),
		get("max_completion_tokens", &maxCompletion),
		get("temperature", &wr.Temperature),
		get("top_p", &wr.TopP),
		get("stream", &wr.Stream),
	} {
		if err != nil {
			return wireRequest{}, err
		}
	}
	wr.MaxTokens = max(maxTokens, maxCompletion)
	for i, m := range msgs {
		if m.Role == "" {
			return wireRequest{}, fmt.Errorf("messages[%d]: role is required", i)
		}
		wr.Messages = append(wr.Messages, schema.Message{Role: m.Role, Content: m.Content})
	}
	return wr, nil
}

// request is what the script and the fault schedule see of wr.
func (wr *wireRequest) request(n int, authorized bool) Request {
	req := newRequest(n, wr.Model, wr.Messages)
	req.Fields = wr.Fields
	req.Logprobs = wr.Logprobs
	req.ReturnTokenIDs = wr.ReturnTokenIDs
	req.ReturnTokensAsTokenIDs = wr.ReturnTokensAsTokenIDs
	req.ReturnMetaInfo = wr.ReturnMetaInfo
	req.ReturnPromptTokenIDs = wr.ReturnPromptTokenIDs
	req.MaxTokens = wr.MaxTokens
	req.Temperature, req.TopP = wr.Temperature, wr.TopP
	req.Authorized = authorized
	return req
}

// wireMessageIn is a request message; content is a string or a list of
// parts.
type wireMessageIn struct {
	Role    string
	Content []schema.Part
}

func (m *wireMessageIn) UnmarshalJSON(b []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	m.Role = raw.Role
	switch {
	case len(raw.Content) == 0 || string(raw.Content) == "null":
	case raw.Content[0] == '"':
		var s string
		if err := json.Unmarshal(raw.Content, &s); err != nil {
			return err
		}
		m.Content = []schema.Part{schema.TextPart(s)}
	default:
		if err := json.Unmarshal(raw.Content, &m.Content); err != nil {
			return err
		}
		for i, p := range m.Content {
			switch p.Type {
			case "text":
			case "image_url":
				if p.ImageURL == nil || p.ImageURL.URL == "" {
					return fmt.Errorf("content[%d]: image_url part without a url", i)
				}
			default:
				return fmt.Errorf("content[%d]: unsupported part type %q", i, p.Type)
			}
		}
	}
	return nil
}
