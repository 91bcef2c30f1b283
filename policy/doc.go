// Package policy calls the model being trained. A Client sends a prompt to
// an OpenAI-compatible chat-completions server (vLLM, SGLang, a hosted
// provider) through openai-go and returns what a trainer needs from the
// reply: the text, the reasoning, the generated token ids and one logprob
// per token, and the call's cost (latency, attempts, prompt, completion and
// cached tokens).
//
// One Client serves a whole batch: it holds the MaxInflight limiter shared
// by every desktop, owns the one retry policy (a per-attempt StepTimeout,
// then Retries more tries after a timeout, a connection error, 429 or 5xx,
// never after 400/401/403/404 or once the caller's ctx is done), and
// learns once, for the rest of the batch, how the server gives exact token
// ids: return_token_ids, vLLM's return_tokens_as_token_ids or SGLang's
// return_meta_info, or not at all (TokenIDSource; each step's
// Response.TokenIDsSource says how its ids came).
//
// The Harness interface (harness.go) is the other half of the agent: it
// turns observations into prompts and replies into desktop actions.
package policy
