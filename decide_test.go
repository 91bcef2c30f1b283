package rl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

// TestDecide holds every way a try can end against the status it gets:
// decide is the one place statuses are decided.
func TestDecide(t *testing.T) {
	deskFail := &desktopError{err: errors.New("act: vm died"), failed: true}
	unsupported := &desktopError{err: fmt.Errorf("reset: %w", desktop.ErrUnsupported)}
	policyErr := &policyFailure{err: &policy.Error{Err: policy.ErrServer, Status: 500}}
	refused := &policyFailure{err: &policy.Error{Err: policy.ErrUnauthorized, Status: 401}}
	ownRefused := &policyFailure{err: &policy.Error{Err: policy.ErrUnauthorized, Status: 401}, own: true}
	storeErr := &storeFailure{errors.New("disk full")}
	tests := []struct {
		name string
		e    ending
		want verdict
	}{
		{"ok", ending{started: true, graded: true}, verdict{status: schema.StatusOK}},
		{"ok although the batch is stopping", ending{started: true, graded: true, stopped: true}, verdict{status: schema.StatusOK}},
		{"truncated", ending{started: true, graded: true, truncated: true}, verdict{status: schema.StatusTruncated}},
		{"stale, runs again", ending{started: true, graded: true, stale: true, staleLeft: true}, verdict{status: schema.StatusRetried, errKind: schema.ErrorStale}},
		{"stale, no reruns left", ending{started: true, graded: true, stale: true}, verdict{status: schema.StatusOK}},
		{"stale, but its group closed", ending{started: true, graded: true, stale: true, staleLeft: true, groupClosed: true}, verdict{status: schema.StatusSurplus}},
		{"surplus", ending{started: true, graded: true, groupClosed: true}, verdict{status: schema.StatusSurplus}},
		{"ok, the desktop failed its second grade", ending{started: true, graded: true, desktopFailed: true}, verdict{status: schema.StatusOK, replace: true}},
		{"truncated, the desktop failed its second grade", ending{started: true, graded: true, truncated: true, desktopFailed: true}, verdict{status: schema.StatusTruncated, replace: true}},
		{"surplus, the desktop failed its second grade", ending{started: true, graded: true, groupClosed: true, desktopFailed: true}, verdict{status: schema.StatusSurplus, replace: true}},
		{"surplus although truncated", ending{started: true, graded: true, truncated: true, groupClosed: true}, verdict{status: schema.StatusSurplus}},
		{"skipped", ending{groupClosed: true}, verdict{status: schema.StatusSkipped}},
		{"no desktop", ending{err: errNoDesktop}, verdict{status: schema.StatusError, errKind: schema.ErrorEnv}},
		{"interrupted", ending{started: true, err: deskFail, desktopFailed: true, stopped: true}, verdict{}},
		{"interrupted while its group closed", ending{started: true, err: errGroupClosed, stopped: true, groupClosed: true}, verdict{}},
		{"store failure", ending{started: true, err: storeErr}, verdict{stop: storeErr}},
		{"refused key", ending{started: true, err: refused}, verdict{stop: fmt.Errorf("policy server refused the batch: %w", refused.err)}},
		{"refused by the group's own server", ending{started: true, err: ownRefused}, verdict{status: schema.StatusError, errKind: schema.ErrorPolicy}},
		{"cancelled", ending{started: true, err: errGroupClosed, groupClosed: true}, verdict{status: schema.StatusCancelled}},
		{"cancelled, desktop broken", ending{started: true, err: deskFail, desktopFailed: true, groupClosed: true}, verdict{status: schema.StatusCancelled, replace: true}},
		{"cancelled, policy failed", ending{started: true, err: policyErr, groupClosed: true}, verdict{status: schema.StatusCancelled}},
		{"policy error", ending{started: true, err: policyErr, triesLeft: true}, verdict{status: schema.StatusError, errKind: schema.ErrorPolicy}},
		{"unsupported", ending{started: true, err: unsupported, triesLeft: true}, verdict{status: schema.StatusError, errKind: schema.ErrorEnv}},
		{"bad reward", ending{started: true, err: errBadReward, triesLeft: true}, verdict{status: schema.StatusError, errKind: schema.ErrorEnv}},
		{"retried", ending{started: true, err: deskFail, desktopFailed: true, triesLeft: true}, verdict{status: schema.StatusRetried, errKind: schema.ErrorEnv, replace: true}},
		{"env error after the retries", ending{started: true, err: deskFail, desktopFailed: true}, verdict{status: schema.StatusError, errKind: schema.ErrorEnv, replace: true}},
	}
	errText := cmp.Comparer(func(a, b error) bool { return (a == nil) == (b == nil) && (a == nil || a.Error() == b.Error()) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.e)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(verdict{}), errText); diff != "" {
				t.Errorf("decide(%+v) (-want +got):\n%s", tt.e, diff)
			}
		})
	}
}
