package rl

import (
	"errors"
	"fmt"

	"legato/rl/policy"
	"legato/rl/schema"
)

// ending is how one try of an attempt ended: what the try saw, and what the
// scheduler knew of the attempt's group when it ended. It holds facts, not
// a verdict; decide turns it into one.
type ending struct {
	// started: the try was given a desktop and began. A try that never
	// started was ended by its group closing or by the batch having no
	// desktop left (err says which).
	started bool
	// graded: the evaluator returned a reward; truncated: the rollout
	// timeout ended the stepping first.
	graded    bool
	truncated bool
	// err is what ended a try that was not graded.
	err error
	// desktopFailed: err is a failure of the desktop itself
	// (desktop.IsFailure, judged when the call returned), so the desktop
	// must be replaced.
	desktopFailed bool

	// stopped: the batch was stopping (Ctrl-C, or a fatal error) when the
	// try ended.
	stopped bool
	// groupClosed: the group had G finished attempts when the try ended.
	groupClosed bool
	// triesLeft: the attempt may run again after a desktop failure
	// (EnvRetries).
	triesLeft bool
}

// verdict is what becomes of a try.
type verdict struct {
	// status of the try's record; "" when it leaves none: it runs again
	// when the batch is resumed.
	status  Status
	errKind string
	// replace: close the desktop and make a new one.
	replace bool
	// stop: the batch cannot go on (nothing could be kept, or every other
	// call would fail the same way).
	stop error
}

// decide is the one place that decides an attempt's status. The order of
// the cases is the policy:
//   - work done is kept: a graded try is recorded even when the batch is
//     stopping, as surplus when its group already had G finished;
//   - an interrupted try leaves no record, so that a resume runs it;
//   - failures that every other call would share stop the batch instead of
//     burning its attempts;
//   - a try of a closed group that did not finish is cancelled (skipped if
//     it never started), whatever ended it;
//   - a desktop failure is retried on a new desktop while tries are left.
func decide(e ending) verdict {
	var pf *policyFailure
	var sf *storeFailure
	switch {
	case e.graded && e.groupClosed:
		return verdict{status: schema.StatusSurplus}
	case e.graded && e.truncated:
		return verdict{status: schema.StatusTruncated}
	case e.graded:
		return verdict{status: schema.StatusOK}
	case !e.started && e.groupClosed:
		return verdict{status: schema.StatusSkipped}
	case !e.started:
		return verdict{status: schema.StatusError, errKind: schema.ErrorEnv}
	case e.stopped:
		return verdict{}
	case errors.As(e.err, &sf):
		return verdict{stop: sf}
	case errors.As(e.err, &pf) && pf.refused():
		return verdict{stop: fmt.Errorf("policy server refused the batch: %w", pf.err)}
	case e.groupClosed:
		// A desktop that failed on its own just before its group closed
		// is still broken.
		return verdict{status: schema.StatusCancelled, replace: e.desktopFailed}
	case errors.As(e.err, &pf):
		return verdict{status: schema.StatusError, errKind: schema.ErrorPolicy}
	case !e.desktopFailed:
		// The task cannot run here, or the desktop graded out of range:
		// another desktop of the same kind would do the same.
		return verdict{status: schema.StatusError, errKind: schema.ErrorEnv}
	case e.triesLeft:
		return verdict{status: schema.StatusRetried, errKind: schema.ErrorEnv, replace: true}
	}
	return verdict{status: schema.StatusError, errKind: schema.ErrorEnv, replace: true}
}

// policyFailure marks a model call that failed for good: after its
// retries, and after the server answered again if it was down. own is set
// when the call went to its group's own server (a service's per-group
// policy), whose refusal is that group's failure only.
type policyFailure struct {
	err error
	own bool
}

func (e *policyFailure) Error() string { return "policy: " + e.err.Error() }
func (e *policyFailure) Unwrap() error { return e.err }

// refused reports a server that refuses the key or the model: every other
// call would fail the same way.
func (e *policyFailure) refused() bool {
	return !e.own && (errors.Is(e.err, policy.ErrUnauthorized) || errors.Is(e.err, policy.ErrNotFound))
}

// storeFailure marks a failure to write the run directory: nothing the
// batch does could be kept.
type storeFailure struct{ err error }

func (e *storeFailure) Error() string { return "run store: " + e.err.Error() }
func (e *storeFailure) Unwrap() error { return e.err }

// Errors that end tries without a desktop failure.
var (
	errBadReward   = errors.New("reward out of [0, 1]")
	errGroupClosed = errors.New("the attempt's group closed")
	errNoDesktop   = errors.New("no desktop")
)
