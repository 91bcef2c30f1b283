package rl

import (
	"encoding/base64"
	"fmt"
	"reflect"

	"legato/rl/export"
	"legato/rl/schema"
)

// GroupResult is an ended group as a trainer takes it: every attempt's
// final record, and for the graded ones the samples export writes.
type GroupResult struct {
	GroupInfo
	// EndVersion is the policy version in force when the group ended: its
	// steps' staleness counts the versions after theirs up to it.
	EndVersion string `json:"end_version,omitempty"`
	// AdvantageStd, once the group ended, is the std that divided its
	// attempts' advantages: the service's (CollectOptions.AdvantageStd,
	// kept in its journal).
	AdvantageStd schema.AdvantageStd `json:"advantage_std,omitempty"`
	Attempts     []AttemptResult     `json:"attempts"`
}

// AttemptResult is one attempt of an ended group.
type AttemptResult struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	Status    Status `json:"status"`
	// Reward is set on graded attempts, Advantage on the finished ones
	// that count for the group: (reward − mean) / std over them
	// (GroupResult.AdvantageStd), 0 when all are equal.
	Reward    *float64 `json:"reward"`
	Advantage *float64 `json:"advantage"`
	// Masked is true for attempts a trainer must leave out of its loss:
	// everything but the finished attempts that count for the group. An
	// error of kind env is an infrastructure failure, not the policy's.
	Masked bool              `json:"masked"`
	Error  *schema.ErrorInfo `json:"error"`
	// PolicyVersion is the version in force when the attempt started;
	// each step has its own.
	PolicyVersion string `json:"policy_version"`
	// Steps are the attempt's samples (graded attempts only).
	Steps []StepResult `json:"steps"`
	// StaleSteps counts the steps left out of Steps for being more than
	// ServeOptions.MaxStaleness versions behind the group's end version.
	StaleSteps int `json:"stale_steps,omitempty"`
	// Sequence is the attempt as one token sequence with a loss mask
	// (ServeOptions.Contiguous, graded attempts); SequenceError says why
	// there is none when its prompts do not extend each other. An
	// attempt without its sequence is masked.
	Sequence      *export.Sequence `json:"sequence,omitempty"`
	SequenceError string           `json:"sequence_error,omitempty"`
	// Images, with ResultOptions.AttemptImages, holds each image of the
	// attempt's steps once: sha256 to a PNG data URL.
	Images map[string]string `json:"images,omitempty"`
}

// StepResult is a step's sample with how stale its policy version was. Its
// Images are the prompt's images in order (StepImage), their spans in the
// whole prompt's ids whatever the steps mode.
type StepResult struct {
	export.Sample
	// Staleness is how many policy versions came into force after the
	// step's, up to the one in force when its group ended; absent when
	// the step's version is not one the service put in force.
	Staleness *int `json:"staleness,omitempty"`
	// PromptPrefixMessages, with StepsPrefix, is how many messages at the
	// start of the prompt are those of the step before; Messages then
	// holds the ones after them. (PromptPrefixIDs says the same of the
	// ids.)
	PromptPrefixMessages int `json:"prompt_prefix_messages,omitempty"`
}

// StepsMode says how much of each step a group's result carries.
type StepsMode string

const (
	// StepsFull: every step's whole prompt (the default).
	StepsFull StepsMode = "full"
	// StepsPrefix: each step after the first carries only what its prompt
	// adds to the step before's (messages and ids), for trainers that
	// rebuild a history step by step.
	StepsPrefix StepsMode = "prefix"
	// StepsNone: no steps, only each attempt's outcome (status, reward,
	// advantage, mask), for a trainer that fetches what it needs later.
	StepsNone StepsMode = "none"
)

// ResultOptions shape a group's result.
type ResultOptions struct {
	// Steps is how much of each step to carry; "" is StepsFull.
	Steps StepsMode
	// InlineImages puts each image in the messages as a data URL; else
	// they stay legato-image://<sha256> references (Blob serves them).
	InlineImages bool
	// AttemptImages, instead, puts each image of an attempt once in the
	// attempt's Images, by hash, the messages keeping their references.
	AttemptImages bool
}

// ParseStepsMode reads a steps mode as a query gives it.
func ParseStepsMode(s string) (StepsMode, error) {
	switch m := StepsMode(s); m {
	case "", StepsFull:
		return StepsFull, nil
	case StepsPrefix, StepsNone:
		return m, nil
	}
	return "", fmt.Errorf("%w: steps=%q: want full, prefix or none", ErrBadRequest, s)
}

// Result returns group id once it ended, read back from the run
// directory, shaped by opts.
func (s *Service) Result(id string, opts ResultOptions) (*GroupResult, error) {
	if opts.Steps == "" {
		opts.Steps = StepsFull
	}
	s.mu.Lock()
	g := s.groups[id]
	if g == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	info, endVersion := s.infoLocked(g), g.endVersion
	s.mu.Unlock()
	if !info.State.Ended() {
		return &GroupResult{GroupInfo: info, Attempts: []AttemptResult{}}, nil
	}
	// In attempt order; advantages are over the finished ones, which are
	// never more than G.
	recs, err := schema.ReadRecordsAt(s.opts.Out, s.b.groupFinals(id))
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", id, err)
	}
	var finished []Record
	for _, r := range recs {
		if r.Status.Finished() {
			finished = append(finished, r)
		}
	}
	kind := s.b.sched.advStd
	advs := groupAdvantages(finished, kind)
	res := &GroupResult{GroupInfo: info, EndVersion: endVersion, AdvantageStd: kind, Attempts: make([]AttemptResult, 0, len(recs))}
	for i := range recs {
		r := &recs[i]
		a := AttemptResult{RolloutID: r.RolloutID, Attempt: r.Attempt, Status: r.Status, Reward: r.Reward,
			Masked: true, Error: r.Error, PolicyVersion: r.Policy.Version, Steps: []StepResult{}}
		adv := 0.0
		if r.Status.Finished() {
			adv, advs = advs[0], advs[1:]
			a.Advantage, a.Masked = &adv, false
		}
		if r.Reward != nil {
			if s.opts.Contiguous || info.History == "contiguous" {
				seq, err := export.AttemptSequence(s.store, r)
				if err != nil {
					a.SequenceError, a.Masked = err.Error(), true
				}
				a.Sequence = seq
			}
			if opts.Steps != StepsNone {
				samples, err := export.RecordSamples(s.store, r, adv, export.Options{InlineImages: opts.InlineImages, ImageTokenID: s.opts.ImageTokenID})
				if err != nil {
					return nil, err
				}
				a.Steps, a.StaleSteps = s.stepResults(samples, endVersion)
				if err := s.shapeSteps(&a, opts); err != nil {
					return nil, fmt.Errorf("group %s: %s: %w", id, r.RolloutID, err)
				}
			}
		}
		res.Attempts = append(res.Attempts, a)
	}
	return res, nil
}

// stepResults gives samples their staleness against the version end, and
// leaves out those more than MaxStaleness behind, counting them.
func (s *Service) stepResults(samples []export.Sample, end string) (steps []StepResult, stale int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	steps = make([]StepResult, 0, len(samples))
	for _, smp := range samples {
		st := StepResult{Sample: smp}
		if n, known := s.staleness(smp.PolicyVersion, end); known {
			if s.opts.MaxStaleness > 0 && n > s.opts.MaxStaleness {
				stale++
				continue
			}
			st.Staleness = &n
		}
		steps = append(steps, st)
	}
	return steps, stale
}

// shapeSteps, as opts asks, trims every step to what it adds to the one
// before and gathers the attempt's images.
func (s *Service) shapeSteps(a *AttemptResult, opts ResultOptions) error {
	full := make([][]schema.Message, len(a.Steps))
	for i := range a.Steps {
		st := &a.Steps[i]
		full[i] = st.Messages
		if opts.AttemptImages {
			if a.Images == nil {
				a.Images = map[string]string{}
			}
			for _, img := range st.Images {
				if _, ok := a.Images[img.SHA256]; ok {
					continue
				}
				data, err := s.store.ImagePNG(img.SHA256)
				if err != nil {
					return err
				}
				a.Images[img.SHA256] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(data)
			}
		}
	}
	if opts.Steps != StepsPrefix {
		return nil
	}
	// From the last step back, so that each compares with its
	// predecessor's whole prompt.
	for i := len(a.Steps) - 1; i > 0; i-- {
		st, prev := &a.Steps[i], &a.Steps[i-1]
		n := 0
		for n < len(full[i]) && n < len(full[i-1]) && reflect.DeepEqual(full[i][n], full[i-1][n]) {
			n++
		}
		st.PromptPrefixMessages, st.Messages = n, full[i][n:]
		k := 0
		ids, before := st.PromptTokenIDs, prev.PromptTokenIDs
		for k < len(ids) && k < len(before) && ids[k] == before[k] {
			k++
		}
		st.PromptPrefixIDs, st.PromptTokenIDs = k, ids[k:]
		// The images listed are the prompt's: their spans stay in the
		// whole prompt's ids.
	}
	return nil
}
