package profile

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestQuantize(t *testing.T) {
	tests := []struct {
		name   string
		segs   []Segment
		bucket float64
		want   []Segment
	}{
		{name: "none", bucket: 1},
		{name: "long phases keep their shape",
			segs:   []Segment{{"reset_s", 0, 4}, {"model_s", 4, 6}},
			bucket: 0.5,
			want:   []Segment{{"reset_s", 0, 4}, {"model_s", 4, 6}}},
		{name: "the phase filling most of a bucket wins",
			// Bucket [0,1): act 0.25, wait 0.75 → wait; [1,2): model.
			segs:   []Segment{{"act_s", 0, 0.25}, {"wait_s", 0.25, 1}, {"model_s", 1, 2}},
			bucket: 1,
			want:   []Segment{{"wait_s", 0, 1}, {"model_s", 1, 2}}},
		{name: "short phases summed per bucket",
			// [0,2): obs 0.25+0.25, act 0.5, model 1 → model; [2,4): obs 1.5.
			segs:   []Segment{{"obs_s", 0, 0.25}, {"act_s", 0.25, 0.75}, {"obs_s", 0.75, 1}, {"model_s", 1, 2}, {"obs_s", 2, 3.5}},
			bucket: 2,
			want:   []Segment{{"model_s", 0, 2}, {"obs_s", 2, 3.5}}},
		{name: "gaps stay empty and ends are exact",
			segs:   []Segment{{"reset_s", 0.3, 1}, {"eval_s", 3, 3.7}},
			bucket: 1,
			want:   []Segment{{"reset_s", 0.3, 1}, {"eval_s", 3, 3.7}}},
		{name: "equal neighbours merge",
			segs:   []Segment{{"wait_s", 0, 1}, {"wait_s", 1, 2}},
			bucket: 0.5,
			want:   []Segment{{"wait_s", 0, 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := quantize(tt.segs, tt.bucket)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
