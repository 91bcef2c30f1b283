package policytest

import (
	"fmt"
	"slices"
	"strings"
)

// Version names the server release whose wire behaviour a Server copies.
// The empty Version is the dialect's latest.
type Version string

// The releases the Server can answer as. Each differs from the next in what
// a trainer depends on: how generated and prompt token ids come back, and
// how cached tokens are reported.
const (
	// Latest is the newest behaviour of every dialect: vLLM and SGLang as
	// of mid-2026.
	Latest Version = "latest"

	// VLLM0101 is vLLM 0.10.1: no return_token_ids (an unknown field it
	// ignores), but return_tokens_as_token_ids turns logprob token
	// strings into "token_id:N"; prompt_tokens_details is null when no
	// token was cached (a truthiness check, from 0.9 to mid-2026).
	VLLM0101 Version = "0.10.1"
	// VLLM0102 is vLLM 0.10.2: return_token_ids puts token_ids on the
	// choice and prompt_token_ids at the top level, both null when not
	// asked for; prompt_tokens_details is still null at 0 cached.
	VLLM0102 Version = "0.10.2"

	// SGLang04 is an SGLang release whose chat endpoint returns no token
	// ids in any form: only logprob token strings.
	SGLang04 Version = "0.4"
	// SGLang0513 is SGLang 0.5.13: no return_token_ids on the chat
	// endpoint, but return_meta_info adds the engine's meta_info to the
	// choice, whose output_token_logprobs are [logprob, id, text], and
	// return_prompt_token_ids adds the prompt's ids to the choice.
	SGLang0513 Version = "0.5.13"
)

// Versions lists the releases a dialect can answer as, oldest first.
func Versions(d Dialect) []Version {
	switch d {
	case VLLM:
		return []Version{VLLM0101, VLLM0102, Latest}
	case SGLang:
		return []Version{SGLang04, SGLang0513, Latest}
	case OpenAI:
		return []Version{Latest}
	}
	return nil
}

// release is what a dialect at a version does on the wire.
type release struct {
	// returnTokenIDs: return_token_ids is known (vLLM 0.10.2+, SGLang
	// since mid-2026).
	returnTokenIDs bool
	// nullIDKeys: token_ids and prompt_token_ids are sent as null when
	// not asked for (vLLM); SGLang leaves them out.
	nullIDKeys bool
	// tokensAsIDs: return_tokens_as_token_ids is known (vLLM).
	tokensAsIDs bool
	// metaInfo: return_meta_info and return_prompt_token_ids are known
	// (SGLang 0.5).
	metaInfo bool
	// nullCacheAtZero: cached-token details are null when nothing was
	// cached (vLLM 0.9 to mid-2026).
	nullCacheAtZero bool
	// imageTokens: prompt_tokens_details carries image_tokens for an image
	// prompt, with cached_tokens 0 when cache reporting is off (SGLang
	// since mid-2026).
	imageTokens bool
	// limitWording is vLLM's message for a prompt over
	// --limit-mm-per-prompt, with %d for the limit; limitParam its param.
	limitWording, limitParam string
}

func releaseOf(d Dialect, v Version) (release, error) {
	if v == "" {
		v = Latest
	}
	if !slices.Contains(Versions(d), v) {
		names := make([]string, 0, 3)
		for _, w := range Versions(d) {
			names = append(names, string(w))
		}
		return release{}, fmt.Errorf("unknown %s version %q: want one of %s", d, v, strings.Join(names, ", "))
	}
	// vLLM's wording before mid-2026 and after; SGLang has no such limit
	// flag, but the wording is a fine stand-in for a refused image count.
	oldLimit := "At most %d image(s) may be provided in one request. You can set `--limit-mm-per-prompt` to increase this limit if the model supports it."
	newLimit := "At most %d image(s) may be provided in one prompt. Set `--limit-mm-per-prompt` to increase this limit."
	switch {
	case d == VLLM && v == VLLM0101:
		return release{tokensAsIDs: true, nullCacheAtZero: true, limitWording: oldLimit}, nil
	case d == VLLM && v == VLLM0102:
		return release{returnTokenIDs: true, nullIDKeys: true, tokensAsIDs: true, nullCacheAtZero: true, limitWording: oldLimit}, nil
	case d == VLLM:
		return release{returnTokenIDs: true, nullIDKeys: true, tokensAsIDs: true, limitWording: newLimit, limitParam: "image"}, nil
	case d == SGLang && v == SGLang04:
		return release{limitWording: oldLimit}, nil
	case d == SGLang && v == SGLang0513:
		return release{metaInfo: true, limitWording: oldLimit}, nil
	case d == SGLang:
		return release{returnTokenIDs: true, metaInfo: true, imageTokens: true, limitWording: newLimit}, nil
	}
	return release{limitWording: newLimit}, nil
}
