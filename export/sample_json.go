package export

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"

	"legato/rl/schema"
)

// appendTail appends tail's JSON object, byte for byte what encoding/json
// writes for it (HTML characters not escaped), with its number arrays
// appended directly: the prompt's token ids are most of every line, and
// encoding/json's reflection over them was a third of an export's CPU.
// The strings go through enc (encoding/json), which knows their escapes.
// TestAppendTail holds it to encoding/json; TestSampleWriterLayout holds
// sampleTail to Sample.
func appendTail(b []byte, t *sampleTail, enc func(any) ([]byte, error)) ([]byte, error) {
	str := func(name string, v any) error {
		s, err := enc(v)
		if err != nil {
			return err
		}
		b = append(b, name...)
		b = append(b, s...)
		return nil
	}
	b = append(b, `{"images":`...)
	b = appendImages(b, t.Images)
	b = append(b, ',')
	if t.PromptPrefixIDs != 0 {
		b = append(b, `"prompt_prefix_ids":`...)
		b = strconv.AppendInt(b, int64(t.PromptPrefixIDs), 10)
		b = append(b, ',')
	}
	switch {
	case len(t.PromptTokenIDs) > 0:
		b = append(b, `"prompt_token_ids":`...)
		b = appendInts(b, t.PromptTokenIDs)
		b = append(b, ',')
	case slices.ContainsFunc(t.promptChunks, func(c []int64) bool { return len(c) > 0 }):
		b = append(b, `"prompt_token_ids":`...)
		b = schema.AppendTokenIDChunks(b, t.promptChunks)
		b = append(b, ',')
	}
	if err := str(`"response_text":`, t.ResponseText); err != nil {
		return b, err
	}
	if err := str(`,"response_reasoning":`, t.ResponseReasoning); err != nil {
		return b, err
	}
	b = append(b, `,"response_token_ids":`...)
	b = appendInts(b, t.ResponseTokenIDs)
	b = append(b, `,"response_logprobs":`...)
	var ok bool
	if t.logprobsText != nil {
		b = append(b, '[')
		b = append(b, t.logprobsText...)
		b = append(b, ']')
	} else if b, ok = appendFloats(b, t.ResponseLogprobs); !ok {
		// NaN or ±Inf: encoding/json's error says which.
		_, err := enc(t.ResponseLogprobs)
		return b, err
	}
	if err := str(`,"response_tokens":`, t.ResponseTokens); err != nil {
		return b, err
	}
	if t.TokenIDsSource != "" {
		if err := str(`,"token_ids_source":`, t.TokenIDsSource); err != nil {
			return b, err
		}
	}
	if err := str(`,"finish_reason":`, t.FinishReason); err != nil {
		return b, err
	}
	if len(t.Warnings) > 0 {
		if err := str(`,"warnings":`, t.Warnings); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

// appendInts appends ids as a JSON array; nil is null, as encoding/json
// writes a nil slice.
func appendInts(b []byte, ids []int64) []byte {
	if ids == nil {
		return append(b, "null"...)
	}
	return schema.AppendTokenIDs(b, ids)
}

// appendFloats appends fs as a JSON array in encoding/json's number format
// (appendFloat); ok is false for NaN or ±Inf, which JSON cannot hold.
func appendFloats(b []byte, fs []float64) (_ []byte, ok bool) {
	if fs == nil {
		return append(b, "null"...), true
	}
	b = append(b, '[')
	for i, f := range fs {
		if i > 0 {
			b = append(b, ',')
		}
		if b, ok = appendFloat(b, f); !ok {
			return b, false
		}
	}
	return append(b, ']'), true
}

// appendFloat appends f in encoding/json's number format (ES6: exponents
// only below 1e-6 and from 1e21 on, two digits at least dropped to one);
// ok is false for NaN or ±Inf.
func appendFloat(b []byte, f float64) (_ []byte, ok bool) {
	if f == 0 && !math.Signbit(f) {
		// Most of a contiguous sample's logprobs: the context's zeros.
		return append(b, '0'), true
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-07 → e-7, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

// appendAttemptSample appends s's JSON object, byte for byte what
// encoding/json writes for it (HTML characters not escaped), its number
// arrays appended directly: a contiguous sample is three arrays as long as
// the attempt's sequence. The strings go through enc. TestAppendAttemptSample
// holds it to encoding/json.
func appendAttemptSample(b []byte, s *AttemptSample, texts []stepText, enc func(any) ([]byte, error)) (_ []byte, advAt int, err error) {
	str := func(name string, v any) {
		if err != nil {
			return
		}
		var j []byte
		if j, err = enc(v); err == nil {
			b = append(b, name...)
			b = append(b, j...)
		}
	}
	num := func(name string, f float64) {
		if err != nil {
			return
		}
		b = append(b, name...)
		var ok bool
		if b, ok = appendFloat(b, f); !ok {
			_, err = enc(f) // NaN or ±Inf: encoding/json's error says which
		}
	}
	str(`{"rollout_id":`, s.RolloutID)
	str(`,"task_id":`, s.TaskID)
	str(`,"group_id":`, s.GroupID)
	if err != nil {
		return b, 0, err
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(s.Attempt), 10)
	str(`,"status":`, s.Status)
	num(`,"reward":`, s.Reward)
	if err != nil {
		return b, 0, err
	}
	b = append(b, `,"advantage":`...)
	advAt = len(b)
	if b, err = appendAdvantage(b, s.Advantage); err != nil {
		return b, 0, err
	}
	b = append(b, `,"token_ids":`...)
	b = appendInts(b, s.TokenIDs)
	b = append(b, `,"loss_mask":`...)
	b = appendInts32(b, s.LossMask)
	b = append(b, `,"logprobs":`...)
	var ok bool
	if len(texts) > 0 && len(texts) == len(s.StepStarts) && s.Logprobs != nil {
		b = appendSequenceLogprobs(b, len(s.Logprobs), s.StepStarts, texts)
	} else if b, ok = appendFloats(b, s.Logprobs); !ok {
		_, err := enc(s.Logprobs)
		return b, 0, err
	}
	b = append(b, `,"prompt_length":`...)
	b = strconv.AppendInt(b, int64(s.PromptLength), 10)
	b = append(b, `,"step_starts":`...)
	b = appendInts32(b, s.StepStarts)
	str(`,"policy_versions":`, s.PolicyVersions)
	b = append(b, `,"images":`...)
	b = appendImages(b, s.Images)
	return append(b, '}'), advAt, err
}

// advantageWidth is the width of an exported advantage: the longest number
// appendFloat writes (17 significant digits, a sign, and "0.00000" before
// them or an exponent). An export writing in one pass leaves that much
// room for each advantage and writes it once its group is known.
const advantageWidth = len("-0.0000012345678901234567")

// appendAdvantage appends adv in encoding/json's number format after the
// spaces that make it advantageWidth bytes: JSON allows whitespace before
// a value, so a reader gets the number encoding/json would have written.
// It fails for NaN or ±Inf, which JSON cannot hold.
func appendAdvantage(b []byte, adv float64) ([]byte, error) {
	var num [32]byte
	n, ok := appendFloat(num[:0], adv)
	if !ok {
		return b, fmt.Errorf("json: unsupported value: %v", adv)
	}
	if len(n) > advantageWidth {
		return b, fmt.Errorf("advantage %v: %d bytes, more than the %d an export leaves for it", adv, len(n), advantageWidth)
	}
	for range advantageWidth - len(n) {
		b = append(b, ' ')
	}
	return append(b, n...), nil
}

// appendInts32 appends ints as a JSON array; nil is null.
func appendInts32(b []byte, ints []int) []byte {
	if ints == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, v := range ints {
		if i > 0 {
			b = append(b, ',')
		}
		if v == 0 || v == 1 {
			// A loss mask's digits.
			b = append(b, byte('0'+v))
			continue
		}
		b = strconv.AppendInt(b, int64(v), 10)
	}
	return append(b, ']')
}

// stepText is the text of one step's logprobs (schema.RecordText) and how
// many numbers it holds.
type stepText struct {
	text []byte
	n    int
}

// appendSequenceLogprobs appends the logprobs of a sequence of n tokens
// whose step i generated texts[i].n tokens from starts[i]: zeros, with
// each step's logprobs copied from its text, as appendFloats writes them.
func appendSequenceLogprobs(b []byte, n int, starts []int, texts []stepText) []byte {
	b = append(b, '[')
	at := 0
	zeros := func(to int) {
		for ; at < to; at++ {
			if at > 0 {
				b = append(b, ',')
			}
			b = append(b, '0')
		}
	}
	for i, t := range texts {
		zeros(starts[i])
		if at > 0 {
			b = append(b, ',')
		}
		b = append(b, t.text...)
		at += t.n
	}
	zeros(n)
	return append(b, ']')
}

// appendUnescapedHTML appends the JSON text src with the escapes of the
// HTML characters that encoding/json.Marshal writes (\u003c, \u003e,
// \u0026) replaced by the characters, and its \ufffd by U+FFFD: a stored
// message's canonical JSON becomes what an Encoder with
// SetEscapeHTML(false) writes for it once loaded, without decoding and
// encoding it again (a sixth of a per-step export's CPU). (Marshal writes
// invalid UTF-8 as \ufffd, which a loaded message holds as U+FFFD, written
// as it is.) Every other escape is kept; TestMessageJSONAsEncoded holds it
// to encoding/json.
func appendUnescapedHTML(dst, src []byte) []byte {
	for {
		i := bytes.IndexByte(src, '\\')
		if i < 0 || i+1 >= len(src) {
			return append(dst, src...)
		}
		dst = append(dst, src[:i]...)
		if src[i+1] == 'u' && i+6 <= len(src) {
			var r string
			switch string(src[i+2 : i+6]) {
			case "003c":
				r = "<"
			case "003e":
				r = ">"
			case "0026":
				r = "&"
			case "fffd":
				r = "\ufffd"
			}
			if r != "" {
				dst, src = append(dst, r...), src[i+6:]
				continue
			}
		}
		// Any other escape, \\ included, as it is.
		dst, src = append(dst, src[i:i+2]...), src[i+2:]
	}
}
