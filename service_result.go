package rl

import (
	"fmt"

	"legato/rl/export"
	"legato/rl/schema"
)

// GroupResult is an ended group as a trainer takes it: every attempt's
// final record, and for the graded ones the samples export writes.
type GroupResult struct {
	GroupInfo
	Attempts []AttemptResult `json:"attempts"`
}

// AttemptResult is one attempt of an ended group.
type AttemptResult struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	Status    Status `json:"status"`
	// Reward is set on graded attempts, Advantage on the finished ones
	// that count for the group: (reward − mean) / std over them, 0 when
	// all are equal.
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
}

// StepResult is a step's sample with how stale its policy version was.
type StepResult struct {
	export.Sample
	// Staleness is how many policy versions came into force after the
	// step's, up to the one in force when its group ended; absent when
	// the step's version is not one the service put in force.
	Staleness *int `json:"staleness,omitempty"`
}

// Result returns group id once it ended, read back from the run
// directory. Images stay legato-image://<sha256> references (Blob serves
// them) unless inline.
func (s *Service) Result(id string, inline bool) (*GroupResult, error) {
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
	recs, err := schema.ReadRecordsAt(s.opts.Out, s.b.sched.finals(id))
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", id, err)
	}
	var finished []Record
	for _, r := range recs {
		if r.Status.Finished() {
			finished = append(finished, r)
		}
	}
	advs := groupAdvantages(finished)
	res := &GroupResult{GroupInfo: info, Attempts: make([]AttemptResult, 0, len(recs))}
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
			samples, err := export.RecordSamples(s.store, r, adv, inline)
			if err != nil {
				return nil, err
			}
			a.Steps, a.StaleSteps = s.stepResults(samples, endVersion)
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
