package profile

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/schema"
)

// TestStepBreakdown: a step's model time and its actions' phases average
// per step and per action; the screenshot's split only over the actions
// that have it; DONE, which ran nothing, is no action.
func TestStepBreakdown(t *testing.T) {
	rec := &schema.Record{
		Timing: schema.Timing{TotalS: 20, QueueS: 1, ModelS: 5},
		Steps: []schema.Step{
			{Model: schema.ModelCall{Seconds: 2, QueueS: 1}, Actions: []schema.ActionRecord{
				{ActS: 0.2, WaitS: 0.5, ObsS: 0.3, CaptureS: 0.05, EncodeS: 0.15, TransferS: 0.1},
				{ActS: 0.4, WaitS: 0.7, ObsS: 1.1},
			}},
			{Model: schema.ModelCall{Seconds: 3}, Actions: []schema.ActionRecord{{Action: "DONE"}}},
		},
	}
	var b StepBreakdown
	b.add(rec)
	b.mean()
	want := StepBreakdown{Steps: 2, Actions: 2, Split: 1, QueueS: 0.5, ModelS: 2.5, ActS: 0.3, WaitS: 0.6, ObsS: 0.7,
		CaptureS: 0.05, EncodeS: 0.15, TransferS: 0.1, NonModelS: 7}
	if diff := cmp.Diff(want, b, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("breakdown (-want +got):\n%s", diff)
	}
}
