package export

import (
	"fmt"
	"slices"

	"legato/rl/schema"
)

// This file holds the per-step samples: Sample, what each of its fields is
// loaded from, and the prompt ids a step shares with the step before
// (Options.PromptPrefix).

// Sample is one line of an export: one model call of a finished attempt,
// with the prompt it was given, what the model generated and the attempt's
// reward and group advantage. Decode lines into it.
type Sample struct {
	RolloutID string        `json:"rollout_id"`
	TaskID    string        `json:"task_id"`
	GroupID   string        `json:"group_id"`
	Attempt   int           `json:"attempt"`
	Step      int           `json:"step"` // index into the record's steps, from 0
	Status    schema.Status `json:"status"`
	// PolicyVersion is the version of the weights that generated the
	// response (the step's, see schema.Step.PolicyVersion), so a trainer
	// can correct for off-policy samples.
	PolicyVersion string  `json:"policy_version"`
	Reward        float64 `json:"reward"`
	Advantage     float64 `json:"advantage"`
	// Messages is the exact prompt of the call.
	Messages []schema.Message `json:"messages"`
	// Images are the prompt's images in order, with their spans in
	// PromptTokenIDs (whole prompts' positions, PromptPrefix or not);
	// null when it has none.
	Images []StepImage `json:"images"`
	// PromptPrefixIDs, with Options.PromptPrefix, is how many ids at the
	// start of the prompt are those at the start of the previous step's
	// prompt; PromptTokenIDs then holds the ids after them (absent when
	// none follow). Absent otherwise, and for a first step.
	PromptPrefixIDs int `json:"prompt_prefix_ids,omitempty"`
	// PromptTokenIDs are the prompt's token ids as the server tokenized
	// it (chat template and image tokens included); absent when the server
	// did not return them.
	PromptTokenIDs    []int64   `json:"prompt_token_ids,omitempty"`
	ResponseText      string    `json:"response_text"`
	ResponseReasoning string    `json:"response_reasoning"`
	ResponseTokenIDs  []int64   `json:"response_token_ids"`
	ResponseLogprobs  []float64 `json:"response_logprobs"`
	// ResponseTokens holds token strings when the server gave no ids.
	ResponseTokens []string `json:"response_tokens"`
	// TokenIDsSource says how the response's ids came; keep the samples
	// whose source is exact (schema.TokenIDSource.Exact) for a
	// token-level loss.
	TokenIDsSource schema.TokenIDSource `json:"token_ids_source,omitempty"`
	FinishReason   string               `json:"finish_reason"`
	// Warnings repeats the step's data warnings, such as a logprobs and
	// token ids length mismatch.
	Warnings []string `json:"warnings,omitempty"`
}

// sampleHead and sampleTail are the fields of Sample before and after its
// messages. A line is written in three pieces so that a prompt with inline
// screenshots (tens of MB) is never encoded as one buffer.
// TestSampleWriterLayout keeps the pieces in step with Sample.
type sampleHead struct {
	RolloutID     string        `json:"rollout_id"`
	TaskID        string        `json:"task_id"`
	GroupID       string        `json:"group_id"`
	Attempt       int           `json:"attempt"`
	Step          int           `json:"step"`
	Status        schema.Status `json:"status"`
	PolicyVersion string        `json:"policy_version"`
	Reward        float64       `json:"reward"`
	Advantage     float64       `json:"advantage"`
}

type sampleTail struct {
	Images          []StepImage `json:"images"`
	PromptPrefixIDs int         `json:"prompt_prefix_ids,omitempty"`
	PromptTokenIDs  []int64     `json:"prompt_token_ids,omitempty"`
	// promptChunks, when set, are the prompt's ids as the store's chunks
	// (PromptTokenIDs is then nil): appendTail writes them one after the
	// other, without first copying the prompt into one slice.
	promptChunks [][]int64
	// logprobsText, when set, is ResponseLogprobs as the record's line
	// holds them (schema.RecordText), which appendTail copies.
	logprobsText      []byte
	ResponseText      string               `json:"response_text"`
	ResponseReasoning string               `json:"response_reasoning"`
	ResponseTokenIDs  []int64              `json:"response_token_ids"`
	ResponseLogprobs  []float64            `json:"response_logprobs"`
	ResponseTokens    []string             `json:"response_tokens"`
	TokenIDsSource    schema.TokenIDSource `json:"token_ids_source,omitempty"`
	FinishReason      string               `json:"finish_reason"`
	Warnings          []string             `json:"warnings,omitempty"`
}

// stepSample loads the sample of step i of rec, with advantage adv, in the
// three pieces a line is written in (stepHeadTail, and the messages).
func stepSample(store *schema.MessageStore, rec *schema.Record, i int, adv float64, load schema.LoadOptions, images *imageLister) (sampleHead, []schema.Message, sampleTail, error) {
	msgs, err := store.LoadRequest(rec.Steps[i], load)
	if err != nil {
		return sampleHead{}, nil, sampleTail{}, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
	}
	head, tail, err := stepHeadTail(store, rec, i, adv, nil, images)
	return head, msgs, tail, err
}

// stepHeadTail loads the fields of step i's sample before and after its
// messages, its images listed by images; prev is the prompt of step i-1
// as chunks, nil for none. Logprobs with a defect are left out and the
// defect named in its warnings: only an export with AllowBadLogprobs gets
// that far.
func stepHeadTail(store *schema.MessageStore, rec *schema.Record, i int, adv float64, prev [][]int64, images *imageLister) (sampleHead, sampleTail, error) {
	step := &rec.Steps[i]
	var prevStep schema.Step
	if i > 0 {
		prevStep = rec.Steps[i-1]
	}
	promptChunks, _, err := store.PromptTokenIDChunksAfter(*step, prevStep, prev)
	if err != nil {
		return sampleHead{}, sampleTail{}, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
	}
	imgs, err := images.list(step.Request, promptChunks)
	if err != nil {
		return sampleHead{}, sampleTail{}, fmt.Errorf("rollout %s step %d: images: %w", rec.RolloutID, i, err)
	}
	head := sampleHead{RolloutID: rec.RolloutID, TaskID: rec.TaskID, GroupID: rec.GroupID, Attempt: rec.Attempt,
		Step: i, Status: rec.Status, PolicyVersion: step.Version(rec), Reward: *rec.Reward, Advantage: adv}
	tail := sampleTail{
		Images:            imgs,
		promptChunks:      promptChunks,
		ResponseText:      step.Response.Content,
		ResponseReasoning: step.Response.Reasoning,
		ResponseTokenIDs:  step.Response.TokenIDs,
		ResponseLogprobs:  step.Response.Logprobs,
		ResponseTokens:    step.Response.Tokens,
		TokenIDsSource:    step.Response.TokenIDsSource,
		FinishReason:      step.Response.FinishReason,
		Warnings:          step.Warnings,
	}
	if d := step.LogprobDefect(); d != "" {
		tail.ResponseLogprobs = nil
		if !slices.Contains(tail.Warnings, d) {
			tail.Warnings = append(slices.Clone(tail.Warnings), d)
		}
	}
	return head, tail, nil
}

// RecordSamples returns the samples export writes for rec, one per step,
// with advantage adv; rec must be graded (a reward). Of opts, only
// InlineImages (images stay references without it) and ImageTokenID
// (their spans) count. A service hands them to a trainer one group at a
// time.
func RecordSamples(store *schema.MessageStore, rec *schema.Record, adv float64, opts Options) ([]Sample, error) {
	if rec.Reward == nil {
		return nil, fmt.Errorf("rollout %s: no reward (status %s): only graded attempts have samples", rec.RolloutID, rec.Status)
	}
	load := schema.LoadOptions{KeepImageRefs: !opts.InlineImages}
	images := newImageLister(store, opts.ImageTokenID)
	out := make([]Sample, 0, len(rec.Steps))
	for i := range rec.Steps {
		h, msgs, t, err := stepSample(store, rec, i, adv, load, images)
		if err != nil {
			return nil, err
		}
		out = append(out, Sample{
			RolloutID: h.RolloutID, TaskID: h.TaskID, GroupID: h.GroupID, Attempt: h.Attempt, Step: h.Step,
			Status: h.Status, PolicyVersion: h.PolicyVersion, Reward: h.Reward, Advantage: h.Advantage,
			Messages: msgs, Images: t.Images, PromptPrefixIDs: t.PromptPrefixIDs, PromptTokenIDs: t.promptIDs(), ResponseText: t.ResponseText,
			ResponseReasoning: t.ResponseReasoning, ResponseTokenIDs: t.ResponseTokenIDs,
			ResponseLogprobs: t.ResponseLogprobs, ResponseTokens: t.ResponseTokens,
			TokenIDsSource: t.TokenIDsSource, FinishReason: t.FinishReason, Warnings: t.Warnings,
		})
	}
	return out, nil
}

// commonChunkPrefix is how many ids the prompts a and b, as chunks, start
// with alike. Their first skip chunks are the same chunks (equal hashes),
// which need no comparing.
func commonChunkPrefix(a, b [][]int64, skip int) int {
	n := 0
	for _, c := range b[:skip] {
		n += len(c)
	}
	ai, ao, bi, bo := skip, 0, skip, 0
	for ai < len(a) && bi < len(b) {
		switch {
		case ao == len(a[ai]):
			ai, ao = ai+1, 0
		case bo == len(b[bi]):
			bi, bo = bi+1, 0
		default:
			k := min(len(a[ai])-ao, len(b[bi])-bo)
			m := commonPrefix(a[ai][ao:ao+k], b[bi][bo:bo+k])
			n += m
			if m < k {
				return n
			}
			ao, bo = ao+k, bo+k
		}
	}
	return n
}

// dropIDs returns chunks without their first n ids, sharing their memory.
func dropIDs(chunks [][]int64, n int) [][]int64 {
	for i, c := range chunks {
		if n < len(c) {
			return append([][]int64{c[n:]}, chunks[i+1:]...)
		}
		n -= len(c)
	}
	return nil
}

// commonPrefix is how many ids a and b start with alike.
func commonPrefix(a, b []int64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// promptIDs moves the prompt's ids into PromptTokenIDs, as one slice of
// the caller's, and returns them.
func (t *sampleTail) promptIDs() []int64 {
	if t.promptChunks != nil {
		n := 0
		for _, c := range t.promptChunks {
			n += len(c)
		}
		ids := make([]int64, 0, n)
		for _, c := range t.promptChunks {
			ids = append(ids, c...)
		}
		t.PromptTokenIDs, t.promptChunks = ids, nil
	}
	return t.PromptTokenIDs
}

// writeStepSamples writes rec's lines, one Sample per step, with sw
// (writeRecord, without Options.Contiguous).
func writeStepSamples(rec *schema.Record, text *schema.RecordText, adv float64, sw *sampleWriter, store *schema.MessageStore, opts Options) (lines int, err error) {
	load := schema.LoadOptions{KeepImageRefs: !opts.InlineImages}
	var prev [][]int64 // the previous step's prompt ids, as chunks
	// A step's prompt repeats the messages of the steps before it: each
	// distinct message of the attempt is encoded once (with images inline
	// they are too big to keep, and encoded as they are written).
	clear(sw.msgJSON)
	images := sw.imageLister(store, opts)
	for i := range rec.Steps {
		step := &rec.Steps[i]
		head, tail, err := stepHeadTail(store, rec, i, adv, prev, images)
		if err != nil {
			return lines, err
		}
		if tail.ResponseLogprobs != nil && copyLogprobText {
			tail.logprobsText = text.Logprobs(rec, i)
		}
		msg := func(k int) ([]byte, error) {
			b, ok := sw.msgJSON[step.Request[k]]
			if ok {
				return b, nil
			}
			// The stored JSON with HTML characters unescaped is what
			// encoding/json writes for the message with its images as
			// references (TestMessageJSONAsEncoded).
			canon, err := store.MessageJSON(step.Request[k])
			if err != nil {
				return nil, fmt.Errorf("rollout %s step %d: load request: message %d: %w", rec.RolloutID, i, k, err)
			}
			b = appendUnescapedHTML(nil, canon)
			sw.msgJSON[step.Request[k]] = b
			return b, nil
		}
		if !load.KeepImageRefs {
			msgs, err := store.LoadRequest(*step, load)
			if err != nil {
				return lines, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
			}
			msg = func(k int) ([]byte, error) { return sw.encode(&msgs[k]) }
		}
		whole := tail.promptChunks
		if opts.PromptPrefix && i > 0 {
			n := commonChunkPrefix(prev, whole, sharedChunks(rec.Steps[i-1].PromptTokenChunks, step.PromptTokenChunks))
			tail.PromptPrefixIDs, tail.promptChunks = n, dropIDs(whole, n)
		}
		prev = whole
		if err := sw.write(&head, len(step.Request), msg, &tail); err != nil {
			return lines, err
		}
		lines++
	}
	return lines, nil
}
