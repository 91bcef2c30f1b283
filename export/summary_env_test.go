package export_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/export"
	"legato/rl/schema"
)

// TestSummaryCountsEnvReports: the summary counts resets by kind and grades
// per metric by how they ran, from the records' env blocks; an error record
// a later record replaced is counted as rerun, not as an error.
func TestSummaryCountsEnvReports(t *testing.T) {
	one := 1.0
	recs := []schema.Record{
		{GroupID: "g", Attempt: 0, Status: schema.StatusOK, Reward: &one, Env: &schema.EnvReport{Reset: "fast",
			Grading: []schema.MetricRun{{Metric: "exact_match", Via: "native"}, {Metric: "compare_table", Via: "python"}}}},
		{GroupID: "g", Attempt: 1, Status: schema.StatusError, Error: &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "x"},
			Env: &schema.EnvReport{Reset: "loadvm", ResetWhy: "cheaper here"}},
		{GroupID: "g", Attempt: 1, Status: schema.StatusOK, Reward: &one, Env: &schema.EnvReport{Reset: "fast",
			Grading: []schema.MetricRun{{Metric: "exact_match", Via: "native"}}}},
		{GroupID: "g", Attempt: 2, Status: schema.StatusOK, Reward: &one},
	}
	b := export.NewSummaryBuilder(schema.Policy{}, 1, 1)
	for i := range recs {
		b.Add(&recs[i])
	}
	s := b.Summary()
	if diff := cmp.Diff(map[string]int{"fast": 2, "loadvm": 1}, s.Resets); diff != "" {
		t.Errorf("resets (-want +got):\n%s", diff)
	}
	want := map[string]map[string]int{"exact_match": {"native": 2}, "compare_table": {"python": 1}}
	if diff := cmp.Diff(want, s.Grading); diff != "" {
		t.Errorf("grading (-want +got):\n%s", diff)
	}
	if s.ErrorsRerun != 1 || s.EnvErrors != 0 {
		t.Errorf("errors rerun %d, env errors %d; want 1, 0", s.ErrorsRerun, s.EnvErrors)
	}
}
