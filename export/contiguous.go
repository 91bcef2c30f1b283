package export

import (
	"errors"
	"fmt"
	"slices"

	"legato/rl/schema"
)

// This file holds the contiguous sequences (Options.Contiguous): an
// attempt as one token sequence with a loss mask, and its line.

// Sequence is one attempt as a single token sequence, the shape NeMo RL and
// verl train multi-turn agents on: the first prompt, then each step's
// generated tokens followed by what the next prompt added (the environment's
// turn: template tokens, the new screenshot's image tokens). LossMask is 1
// on generated tokens only, and Logprobs holds the sampler's logprob there
// (0 elsewhere), so a trainer computes its loss and importance ratios
// without retokenizing anything.
type Sequence struct {
	TokenIDs []int64   `json:"token_ids"`
	LossMask []int     `json:"loss_mask"`
	Logprobs []float64 `json:"logprobs"`
	// Logprobs is null when a step came without logprobs (an export with
	// AllowMissingLogprobs).

	// PromptLength is the number of tokens before the first generated one.
	PromptLength int `json:"prompt_length"`
	// StepStarts[i] is where step i's generated tokens start.
	StepStarts []int `json:"step_starts"`
	// PolicyVersions[i] is the version that generated step i's tokens.
	PolicyVersions []string `json:"policy_versions"`
}

// ErrNotContiguous is wrapped by the error of an attempt whose prompts do
// not extend each other token for token, so no single sequence holds it.
var ErrNotContiguous = errors.New("the attempt's prompts are not one growing token sequence")

// AttemptSequence builds rec's contiguous sequence from the token ids the
// server reported: each step's prompt must start with the previous prompt
// followed by the previous step's generated ids. That holds when the
// harness keeps replies verbatim and evicts no screenshot (the contiguous
// history mode) and the server's chat template re-tokenizes a reply into
// the ids it generated; a template that drops reasoning from the history,
// an evicted screenshot or a reply re-tokenized differently breaks it, and
// the error names the step.
func AttemptSequence(store *schema.MessageStore, rec *schema.Record) (*Sequence, error) {
	seq := &Sequence{}
	if err := fillSequence(seq, store, rec); err != nil {
		return nil, err
	}
	return seq, nil
}

// fillSequence builds rec's sequence in seq, reusing the memory of seq's
// slices: an export builds one per attempt on each worker, three arrays as
// long as the attempt's last prompt, and allocating them anew was a tenth
// of its CPU with the collection they cost.
func fillSequence(seq *Sequence, store *schema.MessageStore, rec *schema.Record) error {
	if len(rec.Steps) == 0 {
		return fmt.Errorf("rollout %s: no steps", rec.RolloutID)
	}
	n := 0
	if last := &rec.Steps[len(rec.Steps)-1]; last.PromptTokenCount > 0 {
		// The sequence is the last prompt and its reply: grow once.
		n = last.PromptTokenCount + len(last.Response.TokenIDs)
	}
	*seq = Sequence{
		TokenIDs:       slices.Grow(seq.TokenIDs[:0], n),
		LossMask:       slices.Grow(seq.LossMask[:0], n),
		Logprobs:       slices.Grow(seq.Logprobs[:0], n),
		StepStarts:     seq.StepStarts[:0],
		PolicyVersions: seq.PolicyVersions[:0],
	}
	allLogprobs := true
	var prevIDs [][]int64 // the step before's prompt ids, as chunks
	for i := range rec.Steps {
		st := &rec.Steps[i]
		r := &st.Response
		if !r.TokenIDsSource.Exact() || len(r.TokenIDs) == 0 {
			return fmt.Errorf("rollout %s step %d: no exact generated token ids (token_ids_source %q): a sequence needs them; check the server with legato rl probe", rec.RolloutID, i, r.TokenIDsSource)
		}
		if st.LogprobDefect() != "" || (r.Logprobs != nil && len(r.Logprobs) != len(r.TokenIDs)) {
			return fmt.Errorf("rollout %s step %d: logprobs not one per generated id (%s)", rec.RolloutID, i, st.LogprobDefect())
		}
		var prevStep schema.Step
		if i > 0 {
			prevStep = rec.Steps[i-1]
		}
		chunks, n, err := store.PromptTokenIDChunksAfter(*st, prevStep, prevIDs)
		if err != nil {
			return fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
		}
		if n == 0 {
			return fmt.Errorf("rollout %s step %d: the server returned no prompt token ids, which a sequence is made of (vLLM and SGLang return them with return_token_ids)", rec.RolloutID, i)
		}
		if i == 0 {
			seq.PromptLength = n
		} else if at := departure(chunks, n, sharedChunks(prevStep.PromptTokenChunks, st.PromptTokenChunks), seq.TokenIDs); at >= 0 {
			return fmt.Errorf("rollout %s step %d: %w: its prompt departs from the previous prompt and reply at token %d of %d (an evicted screenshot, reasoning the template leaves out of the history, or a reply re-tokenized differently)",
				rec.RolloutID, i, ErrNotContiguous, at, len(seq.TokenIDs))
		}
		prevIDs = chunks
		// What the environment added since the last reply: context, not
		// trained on.
		added := n - len(seq.TokenIDs)
		seq.TokenIDs = appendIDsFrom(seq.TokenIDs, chunks, len(seq.TokenIDs))
		seq.LossMask = append(seq.LossMask, make([]int, added)...)
		seq.Logprobs = append(seq.Logprobs, make([]float64, added)...)
		seq.StepStarts = append(seq.StepStarts, len(seq.TokenIDs))
		seq.PolicyVersions = append(seq.PolicyVersions, st.Version(rec))
		seq.TokenIDs = append(seq.TokenIDs, r.TokenIDs...)
		for range r.TokenIDs {
			seq.LossMask = append(seq.LossMask, 1)
		}
		if r.Logprobs != nil {
			seq.Logprobs = append(seq.Logprobs, r.Logprobs...)
		} else {
			allLogprobs = false
			seq.Logprobs = append(seq.Logprobs, make([]float64, len(r.TokenIDs))...)
		}
	}
	if !allLogprobs {
		// A 0 standing in for a missing logprob would train as
		// probability 1: none at all rather than some made up.
		seq.Logprobs = nil
	}
	return nil
}

// sharedChunks is how many leading chunk hashes of a step's prompt are the
// step before's: those chunks hold the same ids at the same places, so a
// prompt that extends the one before need not compare them.
func sharedChunks(prev, cur []string) int {
	k := 0
	for k < len(prev) && k < len(cur) && prev[k] == cur[k] {
		k++
	}
	return k
}

// departure is where a prompt of n ids, as chunks, stops extending seq (the
// previous prompt and its reply): the first id that differs, or n when the
// prompt is a shorter prefix of seq; -1 when it starts with all of seq. Its
// first skip chunks are the previous prompt's own, which seq starts with.
func departure(chunks [][]int64, n, skip int, seq []int64) int {
	at := 0
	for k, c := range chunks {
		m := min(len(c), len(seq)-at)
		if m <= 0 {
			break
		}
		if k >= skip {
			for j, id := range c[:m] {
				if id != seq[at+j] {
					return at + j
				}
			}
		}
		at += m
	}
	if n < len(seq) {
		return n
	}
	return -1
}

// appendIDsFrom appends the ids of chunks from id from on.
func appendIDsFrom(dst []int64, chunks [][]int64, from int) []int64 {
	at := 0
	for _, c := range chunks {
		if end := at + len(c); end > from {
			dst = append(dst, c[max(from-at, 0):]...)
		}
		at += len(c)
	}
	return dst
}

// AttemptSample is one line of a contiguous export: one finished attempt
// as a single sequence.
type AttemptSample struct {
	RolloutID string        `json:"rollout_id"`
	TaskID    string        `json:"task_id"`
	GroupID   string        `json:"group_id"`
	Attempt   int           `json:"attempt"`
	Status    schema.Status `json:"status"`
	Reward    float64       `json:"reward"`
	Advantage float64       `json:"advantage"`
	Sequence
	// Images are the sequence's images in order, with their spans in
	// TokenIDs: its last prompt's, which it starts with and which holds
	// every screenshot of the attempt; null when it has none.
	Images []StepImage `json:"images"`
}

// writeSequence writes rec's one line, its AttemptSequence, with sw
// (writeRecord, with Options.Contiguous).
func writeSequence(rec *schema.Record, text *schema.RecordText, adv float64, sw *sampleWriter, store *schema.MessageStore, opts Options) (lines int, err error) {
	if err := fillSequence(&sw.seq, store, rec); err != nil {
		return 0, err
	}
	last := len(rec.Steps) - 1
	imgs, err := sw.imageLister(store, opts).list(rec.Steps[last].Request, [][]int64{sw.seq.TokenIDs[:sw.seq.StepStarts[last]]})
	if err != nil {
		return 0, fmt.Errorf("rollout %s step %d: images: %w", rec.RolloutID, last, err)
	}
	sw.texts = sw.texts[:0]
	if sw.seq.Logprobs != nil && copyLogprobText {
		for i := range rec.Steps {
			t := text.Logprobs(rec, i)
			if t == nil {
				sw.texts = sw.texts[:0]
				break
			}
			sw.texts = append(sw.texts, stepText{t, len(rec.Steps[i].Response.Logprobs)})
		}
	}
	var at int
	sw.tail, at, err = appendAttemptSample(sw.tail[:0], &AttemptSample{RolloutID: rec.RolloutID, TaskID: rec.TaskID, GroupID: rec.GroupID,
		Attempt: rec.Attempt, Status: rec.Status, Reward: *rec.Reward, Advantage: adv, Sequence: sw.seq, Images: imgs}, sw.texts, sw.encode)
	if err == nil {
		sw.advAt = append(sw.advAt, sw.n+int64(at))
		err = sw.put(append(sw.tail, '\n'))
	}
	return 1, err
}
