package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"legato/rl/schema"
)

// How a Client gets exact generated token ids from a server. It asks with
// return_token_ids (vLLM 0.10.2+, SGLang since mid-2026). A server too old
// for it ignores the field, so the client asks once more, at once, with
// the older forms both servers may know: vLLM's return_tokens_as_token_ids
// (logprob token strings become "token_id:N") and SGLang's return_meta_info
// (the choice's meta_info.output_token_logprobs hold [logprob, id, text]),
// each server ignoring the other's field. Whichever answers is kept for the
// rest of the client's life; when neither does, the client keeps the
// logprob token strings, which are lossy.

// idMode is a Client's state in that negotiation.
type idMode int32

const (
	modeAskIDs      idMode = iota // asking return_token_ids, nothing learnt yet
	modeAskFallback               // return_token_ids was ignored or refused: asking the older forms
	modeReturnTokenIDs
	modeTokensAsIDs
	modeMetaInfo
	modeStrings // no exact form: token strings
)

// settled returns the source a mode has settled on, or "" while asking.
func (m idMode) settled() schema.TokenIDSource {
	switch m {
	case modeReturnTokenIDs:
		return schema.SourceReturnTokenIDs
	case modeTokensAsIDs:
		return schema.SourceTokensAsIDs
	case modeMetaInfo:
		return schema.SourceMetaInfo
	case modeStrings:
		return schema.SourceStrings
	}
	return ""
}

// idFields is a set of the request fields that ask for token ids.
type idFields uint8

const (
	fieldReturnTokenIDs idFields = 1 << iota
	fieldTokensAsIDs
	fieldMetaInfo
	fieldPromptTokenIDs // SGLang's return_prompt_token_ids, sent with return_meta_info
)

var idFieldNames = [...]struct {
	f    idFields
	name string
}{
	{fieldReturnTokenIDs, "return_token_ids"},
	{fieldTokensAsIDs, "return_tokens_as_token_ids"},
	{fieldMetaInfo, "return_meta_info"},
	{fieldPromptTokenIDs, "return_prompt_token_ids"},
}

func (f idFields) names() []string {
	var out []string
	for _, n := range idFieldNames {
		if f&n.f != 0 {
			out = append(out, n.name)
		}
	}
	return out
}

// fields are what a request in mode m asks for.
func (m idMode) fields() idFields {
	switch m {
	case modeAskIDs, modeReturnTokenIDs:
		return fieldReturnTokenIDs
	case modeAskFallback:
		return fieldTokensAsIDs | fieldMetaInfo | fieldPromptTokenIDs
	case modeTokensAsIDs:
		return fieldTokensAsIDs
	case modeMetaInfo:
		return fieldMetaInfo | fieldPromptTokenIDs
	}
	return 0
}

// generatedIDs takes the generated ids out of an answer to a request that
// asked with sent: the source they came from and the ids; nil ids and
// SourceStrings when the answer has no exact form.
func generatedIDs(ch *chatChoice, sent idFields) (schema.TokenIDSource, []int64, error) {
	if ch.TokenIDs != nil {
		ids := *ch.TokenIDs
		if ids == nil {
			ids = []int64{}
		}
		return schema.SourceReturnTokenIDs, ids, nil
	}
	if sent&fieldTokensAsIDs != 0 && ch.Logprobs != nil && len(ch.Logprobs.Content) > 0 {
		if ids, ok := placeholderIDs(ch.Logprobs.Content); ok {
			return schema.SourceTokensAsIDs, ids, nil
		}
	}
	if m := ch.MetaInfo; m != nil && m.OutputTokenLogprobs != nil {
		ids := make([]int64, len(m.OutputTokenLogprobs))
		for i, e := range m.OutputTokenLogprobs {
			if len(e) >= 2 {
				if v, ok := firstString(e[1]); ok {
					return "", nil, &StringIDsError{Field: fmt.Sprintf("choices[0].meta_info.output_token_logprobs[%d][1]", i), Value: v}
				}
			}
			id, err := metaInfoID(e)
			if err != nil {
				return "", nil, fmt.Errorf("%w: meta_info.output_token_logprobs[%d]: %v", errBadCompletion, i, err)
			}
			ids[i] = id
		}
		return schema.SourceMetaInfo, ids, nil
	}
	return schema.SourceStrings, nil, nil
}

// StringIDsError is an answer whose token ids came as JSON strings ("123",
// or "token_id:123" as vLLM writes them in logprobs) where legato reads
// JSON integers, as vLLM and SGLang send them: a proxy or a server of its
// own that turns them into strings, not a broken engine. A *Error of such
// an answer wraps it (errors.As).
type StringIDsError struct {
	// Field is where the strings were, e.g. "choices[0].token_ids".
	Field string
	// Value is the first string id as it came, JSON-quoted and cut to 40
	// bytes.
	Value string
}

func (e *StringIDsError) Error() string {
	return fmt.Sprintf("the answer's %s holds token ids as strings (%s), not the JSON integers legato reads", e.Field, e.Value)
}

// stringIDs returns the *StringIDsError behind err, a failed decoding of
// the answer raw into a chatResponse, when err is an id field holding a
// string; nil otherwise.
func stringIDs(raw []byte, err error) *StringIDsError {
	var typ *json.UnmarshalTypeError
	if !errors.As(err, &typ) || typ.Value != "string" {
		return nil
	}
	var loose struct {
		Choices []struct {
			TokenIDs       json.RawMessage `json:"token_ids"`
			PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
		} `json:"choices"`
		PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
	}
	if json.Unmarshal(raw, &loose) != nil {
		return nil
	}
	switch typ.Field {
	case "prompt_token_ids":
		if v, ok := firstString(loose.PromptTokenIDs); ok {
			return &StringIDsError{Field: "prompt_token_ids", Value: v}
		}
	case "choices.token_ids", "choices.prompt_token_ids":
		for i, ch := range loose.Choices {
			field, ids := "token_ids", ch.TokenIDs
			if typ.Field == "choices.prompt_token_ids" {
				field, ids = "prompt_token_ids", ch.PromptTokenIDs
			}
			if v, ok := firstString(ids); ok {
				return &StringIDsError{Field: fmt.Sprintf("choices[%d].%s", i, field), Value: v}
			}
		}
	}
	return nil
}

// firstString returns the first string of a JSON array, or the value
// itself when it is a string, quoted and cut to 40 bytes.
func firstString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		return quoteCut(raw), true
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) != nil {
		return "", false
	}
	for _, e := range elems {
		if e = bytes.TrimSpace(e); len(e) > 0 && e[0] == '"' {
			return quoteCut(e), true
		}
	}
	return "", false
}

func quoteCut(s []byte) string {
	if len(s) > 40 {
		return string(s[:40]) + "…"
	}
	return string(s)
}

// placeholderIDs parses vLLM's "token_id:N" token strings; ok is false
// unless every token is one.
func placeholderIDs(content []chatTokenLogprob) ([]int64, bool) {
	ids := make([]int64, len(content))
	for i, c := range content {
		n, found := strings.CutPrefix(c.Token, "token_id:")
		if !found {
			return nil, false
		}
		id, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return nil, false
		}
		ids[i] = id
	}
	return ids, true
}

// metaInfoID is the id of an output_token_logprobs entry: [logprob, id,
// text], the text null unless the server decoded it.
func metaInfoID(e []json.RawMessage) (int64, error) {
	if len(e) < 2 {
		return 0, fmt.Errorf("entry of %d values, want [logprob, id, text]", len(e))
	}
	var id int64
	if err := json.Unmarshal(e[1], &id); err != nil {
		return 0, fmt.Errorf("token id %s: %v", e[1], err)
	}
	return id, nil
}

// learn moves the client's mode on from what an answer to a request in
// mode from showed: the source its ids came from, and whether it had
// logprobs (without them, a fallback answer shows nothing). It reports
// whether the call should ask once more, at once, in the new mode.
func (c *Client) learn(from idMode, src schema.TokenIDSource, logprobs bool) (askAgain bool) {
	var to idMode
	switch {
	case from == modeAskIDs && src == schema.SourceReturnTokenIDs:
		to = modeReturnTokenIDs
	case from == modeAskIDs:
		to = modeAskFallback
		askAgain = true
	case from == modeAskFallback && src == schema.SourceTokensAsIDs:
		to = modeTokensAsIDs
	case from == modeAskFallback && src == schema.SourceMetaInfo:
		to = modeMetaInfo
	case from == modeAskFallback && src == schema.SourceStrings && logprobs:
		to = modeStrings
	default:
		return false
	}
	if c.mode.CompareAndSwap(int32(from), int32(to)) {
		c.announce(to)
	}
	return askAgain
}

// refuse stops asking for the fields a server refused, and moves on from a
// mode that has nothing left to ask.
func (c *Client) refuse(f idFields) {
	c.refused.Or(int32(f))
	for {
		m := idMode(c.mode.Load())
		if m.fields() == 0 || m.fields()&^c.refusedFields() != 0 {
			return
		}
		to := modeStrings
		if m == modeAskIDs || m == modeReturnTokenIDs {
			to = modeAskFallback
		}
		if c.mode.CompareAndSwap(int32(m), int32(to)) {
			c.announce(to)
		}
	}
}

func (c *Client) refusedFields() idFields { return idFields(c.refused.Load()) }

// announce logs a change of how ids come; token strings loudly.
func (c *Client) announce(m idMode) {
	switch m {
	case modeAskFallback:
		c.log.Info("policy server does not return token_ids; asking with return_tokens_as_token_ids and return_meta_info",
			"url", c.endpoint)
	case modeStrings:
		c.log.Warn("policy server gives no exact token ids: records keep token strings, which are lossy; "+
			"upgrade to vLLM 0.10.2+ or an SGLang with return_token_ids", "url", c.endpoint)
	default:
		c.log.Info("policy token ids settled", "url", c.endpoint, "source", string(m.settled()))
	}
}
