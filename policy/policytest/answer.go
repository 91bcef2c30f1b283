package policytest

import (
	"encoding/json"
	"fmt"
	"time"
)

// shape builds the answer to wr in the dialect and release of the server.
func (s *Server) shape(n int, wr *wireRequest, g *generation, fault Fault) *wireResponse {
	choice := s.message(n, g)
	logprobs := wr.Logprobs && fault != FaultNoLogprobs
	if logprobs {
		asIDs := s.rel.tokensAsIDs && wr.ReturnTokensAsTokenIDs
		lp := &wireLogprobs{Content: make([]wireTokenLogprob, len(g.toks))}
		for i, t := range g.toks {
			tok := t.Text
			if asIDs {
				tok = fmt.Sprintf("token_id:%d", t.ID)
			}
			b := make([]int, len(tok))
			for j := range len(tok) {
				b[j] = int(tok[j])
			}
			lp.Content[i] = wireTokenLogprob{Token: tok, Logprob: &t.Logprob, Bytes: b, TopLogprobs: []struct{}{}}
			if fault == FaultNullLogprobs {
				lp.Content[i].Logprob = nil
			}
		}
		if fault == FaultLogprobsMismatch && len(lp.Content) > 0 {
			lp.Content = lp.Content[:len(lp.Content)-1]
		}
		choice.Logprobs = lp
	}
	id := fmt.Sprintf("chatcmpl-%d", n)
	resp := &wireResponse{ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: wr.Model}

	ids := make([]int64, len(g.toks))
	for i, t := range g.toks {
		ids[i] = t.ID
	}
	// Every server that knows return_token_ids answers it; a server too
	// old for it (or FaultIgnoreField) drops it as an unknown field.
	returnIDs := s.rel.returnTokenIDs && wr.ReturnTokenIDs && fault != FaultIgnoreField
	switch s.opts.Dialect {
	case VLLM:
		if s.rel.nullIDKeys {
			resp.PromptTokenIDs, choice.TokenIDs = jsonNull, jsonNull
		}
		if returnIDs {
			resp.PromptTokenIDs, choice.TokenIDs = mustJSON(g.promptIDs), mustJSON(ids)
		}
		choice.StopReason = jsonNull
	case SGLang:
		if returnIDs {
			choice.TokenIDs = mustJSON(ids)
		}
		if returnIDs || (s.rel.metaInfo && wr.ReturnPromptTokenIDs) {
			choice.PromptTokenIDs = mustJSON(g.promptIDs)
		}
		if s.rel.metaInfo && wr.ReturnMetaInfo {
			choice.MetaInfo = mustJSON(sglangMetaInfo(id, g, logprobs, s.weightVersion()))
		}
		if g.finish == "stop" {
			choice.MatchedStop = mustJSON(EndOfTurn)
		} else {
			choice.MatchedStop = jsonNull
		}
		resp.Metadata = &wireMetadata{WeightVersion: s.weightVersion()}
	}
	resp.Choices = []wireChoice{choice}
	resp.Usage = s.usage(g)
	return resp
}

// message is the choice's message: the reply text, split into reasoning
// and tool calls as the server's parsers would.
func (s *Server) message(n int, g *generation) wireChoice {
	finish := g.finish
	var reasoning string
	content := g.text
	if s.opts.SplitReasoning {
		reasoning, content = splitReasoning(content)
	}
	var calls []wireToolCall
	if s.opts.ToolCalls && finish != "length" {
		calls, content = extractToolCalls(content, n)
		if len(calls) > 0 {
			finish = "tool_calls"
		}
	}
	choice := wireChoice{FinishReason: finish, Message: wireMessageOut{Role: "assistant", ToolCalls: calls}}
	if content != "" || len(calls) == 0 {
		choice.Message.Content = &content
	}
	if reasoning != "" {
		switch s.opts.Dialect {
		case VLLM:
			choice.Message.Reasoning = &reasoning
		case SGLang:
			choice.Message.ReasoningContent = &reasoning
		}
	}
	return choice
}

// sglangMetaInfo is the meta_info SGLang's engine keeps for a request, as
// return_meta_info returns it.
func sglangMetaInfo(id string, g *generation, logprobs bool, version string) map[string]any {
	finish := map[string]any{"type": g.finish}
	if g.finish == "stop" {
		finish["matched"] = EndOfTurn
	}
	meta := map[string]any{
		"id": id, "finish_reason": finish, "prompt_tokens": len(g.promptIDs),
		"completion_tokens": len(g.toks), "cached_tokens": g.cached, "weight_version": version,
	}
	if logprobs {
		out := make([][3]any, len(g.toks))
		for i, t := range g.toks {
			out[i] = [3]any{t.Logprob, t.ID, t.Text}
		}
		meta["output_token_logprobs"] = out
	}
	return meta
}

// usage counts the tokens and reports the cache the way the release does.
func (s *Server) usage(g *generation) wireUsage {
	u := wireUsage{
		PromptTokens:     len(g.promptIDs),
		CompletionTokens: len(g.toks),
		TotalTokens:      len(g.promptIDs) + len(g.toks),
	}
	report := !s.opts.NoCacheReport
	switch s.opts.Dialect {
	case VLLM:
		// A truthiness check on the count until mid-2026: null at 0.
		if report && (g.cached > 0 || !s.rel.nullCacheAtZero) {
			u.PromptTokensDetails = &wireTokensDetails{CachedTokens: g.cached}
		}
	case SGLang:
		zero := 0
		u.ReasoningTokens = &zero
		if report && g.cached > 0 {
			u.PromptTokensDetails = &wireTokensDetails{CachedTokens: g.cached}
		}
		if s.rel.imageTokens && g.images > 0 {
			if u.PromptTokensDetails == nil {
				u.PromptTokensDetails = &wireTokensDetails{}
			}
			u.PromptTokensDetails.ImageTokens = g.images * s.opts.ImageTokens
		}
	case OpenAI:
		u.PromptTokensDetails = &wireTokensDetails{CachedTokens: g.cached}
	}
	return u
}

type wireResponse struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Created        int64           `json:"created"`
	Model          string          `json:"model"`
	Choices        []wireChoice    `json:"choices"`
	Usage          wireUsage       `json:"usage"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
	Metadata       *wireMetadata   `json:"metadata,omitempty"`
}

type wireMetadata struct {
	WeightVersion string `json:"weight_version"`
}

type wireChoice struct {
	Index          int             `json:"index"`
	Message        wireMessageOut  `json:"message"`
	Logprobs       *wireLogprobs   `json:"logprobs"`
	FinishReason   string          `json:"finish_reason"`
	StopReason     json.RawMessage `json:"stop_reason,omitempty"`  // vLLM
	MatchedStop    json.RawMessage `json:"matched_stop,omitempty"` // SGLang
	TokenIDs       json.RawMessage `json:"token_ids,omitempty"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
	MetaInfo       json.RawMessage `json:"meta_info,omitempty"`
}

type wireMessageOut struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	Reasoning        *string        `json:"reasoning,omitempty"`
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
}

type wireToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type wireLogprobs struct {
	Content []wireTokenLogprob `json:"content"`
}

type wireTokenLogprob struct {
	Token       string     `json:"token"`
	Logprob     *float64   `json:"logprob"` // nil: null, as a NaN is sent
	Bytes       []int      `json:"bytes"`
	TopLogprobs []struct{} `json:"top_logprobs"`
}

type wireUsage struct {
	PromptTokens        int                `json:"prompt_tokens"`
	CompletionTokens    int                `json:"completion_tokens"`
	TotalTokens         int                `json:"total_tokens"`
	PromptTokensDetails *wireTokensDetails `json:"prompt_tokens_details"`
	ReasoningTokens     *int               `json:"reasoning_tokens,omitempty"` // SGLang
}

type wireTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
	ImageTokens  int `json:"image_tokens,omitempty"` // SGLang, image prompts
}

// weightVersion is what the SGLang dialect reports as weight_version.
func (s *Server) weightVersion() string {
	if s.opts.WeightVersion != nil {
		if v := s.opts.WeightVersion(); v != "" {
			return v
		}
	}
	return "default"
}
