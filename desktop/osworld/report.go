package osworld

import (
	"fmt"
	"slices"
	"strings"

	"legato/rl/desktop"
)

var (
	_ desktop.Reporter       = (*Desktop)(nil)
	_ desktop.GradeExplainer = (*Desktop)(nil)
)

// AttemptReport says what the desktop did for the attempt since its last
// Reset: which reset ran and why (LastReset's kind and reason) and how
// each metric of the last Evaluate ran, natively or through OSWorld's
// Python; and where: the VM's host and name.
func (d *Desktop) AttemptReport() desktop.AttemptReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := desktop.AttemptReport{
		Reset:    string(d.lastReset.Kind),
		ResetWhy: d.lastReset.Why,
		Golden:   d.lastReset.GoldenKey,
		Grading:  slices.Clone(d.lastGrading),
		Host:     d.host,
		Ended:    slices.Clone(d.lastReset.Ended),
		Spared:   slices.Clone(d.lastReset.Spared),
		// A report read before the wait after the reset says nothing of it.
		UnsettledStart: d.unsettledStart,
	}
	if d.vm != nil {
		r.VM = d.name
	}
	return r
}

// ExplainGrade says what each metric of the last Evaluate was given: the
// value its result getter returned (desktop.GradeExplainer).
func (d *Desktop) ExplainGrade() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return explainGrading(d.lastGrading)
}

// explainGrading puts into words what the metrics that ran were given,
// "metric: result getter TYPE returned VALUE" each.
func explainGrading(runs []desktop.MetricRun) string {
	var parts []string
	for _, m := range runs {
		if m.ResultValue != "" {
			parts = append(parts, fmt.Sprintf("%s: result getter %s returned %s", m.Metric, m.ResultGetter, m.ResultValue))
		}
	}
	return strings.Join(parts, "; ")
}
