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

// TestSummaryPerHost: records that name their host are broken down by it:
// distinct desktops (VMs), tries, finished ones, desktop failures (retried
// and env errors, not policy errors) and the seconds of each phase.
func TestSummaryPerHost(t *testing.T) {
	one, zero := 1.0, 0.0
	env := func(host, vm string) *schema.EnvReport { return &schema.EnvReport{Reset: "fast", Host: host, VM: vm} }
	recs := []schema.Record{
		{GroupID: "g", Attempt: 0, Status: schema.StatusOK, Reward: &one, Env: env("h1", "vm-a"),
			Timing: schema.Timing{ResetS: 2, ModelS: 3, EvalS: 1, TotalS: 7}},
		{GroupID: "g", Attempt: 1, Status: schema.StatusRetried, Error: &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "host gone"},
			Env: env("h2", "vm-b"), Timing: schema.Timing{ResetS: 4, TotalS: 5}},
		{GroupID: "g", Attempt: 1, Status: schema.StatusOK, Reward: &zero, Env: env("h1", "vm-c"),
			Timing: schema.Timing{ResetS: 1, ModelS: 1, TotalS: 2}},
		{GroupID: "g", Attempt: 2, Status: schema.StatusError, Error: &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "x"},
			Env: env("h1", "vm-a"), Timing: schema.Timing{ResetS: 1, TotalS: 1}},
		{GroupID: "g", Attempt: 3, Status: schema.StatusError, Error: &schema.ErrorInfo{Kind: schema.ErrorPolicy, Message: "x"},
			Env: env("h2", "vm-b"), Timing: schema.Timing{ModelS: 6, TotalS: 6}},
		{GroupID: "g", Attempt: 4, Status: schema.StatusOK, Reward: &one}, // a backend that names no host
	}
	b := export.NewSummaryBuilder(schema.Policy{}, 1, 1)
	for i := range recs {
		b.Add(&recs[i])
	}
	phases := func(m map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for _, p := range export.Phases() {
			out[p] = m[p]
		}
		return out
	}
	want := map[string]schema.HostSummary{
		"h1": {Desktops: 2, Attempts: 3, Finished: 2, Failures: 1, AttemptS: 10,
			PhaseS: phases(map[string]float64{export.PhaseReset: 4, export.PhaseModel: 4, export.PhaseEval: 1})},
		"h2": {Desktops: 1, Attempts: 2, Finished: 0, Failures: 1, AttemptS: 11,
			PhaseS: phases(map[string]float64{export.PhaseReset: 4, export.PhaseModel: 6})},
	}
	if diff := cmp.Diff(want, b.Summary().Hosts); diff != "" {
		t.Errorf("hosts (-want +got):\n%s", diff)
	}
}
