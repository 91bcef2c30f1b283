package schema

import (
	"errors"
	"fmt"
)

// ErrDuplicateFinal is wrapped by the error of a reader that met a second
// final record for one attempt (see AttemptRule).
var ErrDuplicateFinal = errors.New("two final records for one attempt")

// DuplicateFinalError names an attempt with two final records and the
// lines of rollouts.jsonl that hold them.
type DuplicateFinalError struct {
	GroupID   string
	Attempt   int
	FirstLine int // the record that decided the attempt
	Line      int // the later one
}

func (e *DuplicateFinalError) Error() string {
	return fmt.Sprintf("attempt %d of group %q has two final records (rollouts.jsonl lines %d and %d)",
		e.Attempt, e.GroupID, e.FirstLine, e.Line)
}

func (e *DuplicateFinalError) Unwrap() error { return ErrDuplicateFinal }

// AttemptRule is the one rule by which every reader of a run (collect's
// resume, export, repair) decides which record is an attempt's: records are
// taken in file order; a retried record never decides an attempt; an error
// record does until a later record of a rerun replaces it (a resume reruns
// error records); any other final record (ok, truncated, surplus, skipped)
// is the attempt's last word, and a later final record of the same attempt
// is an error: legato's writer never makes one, so the file was edited or
// two collects wrote to it, and a trainer would count the attempt twice in
// its group's advantages. The zero value is not ready; use NewAttemptRule.
type AttemptRule struct {
	decided map[attemptKey]decision
}

type attemptKey struct {
	group   string
	attempt int
}

type decision struct {
	line  int
	error bool // the deciding record is an error record, which a rerun may replace
}

// NewAttemptRule returns a rule with no attempt decided.
func NewAttemptRule() *AttemptRule {
	return &AttemptRule{decided: make(map[attemptKey]decision)}
}

// Add takes rec, read from line of rollouts.jsonl. It reports whether rec
// replaces an earlier error record of its attempt (a rerun), and returns a
// *DuplicateFinalError when the attempt was already decided by a record
// that is not an error.
func (a *AttemptRule) Add(rec *Record, line int) (rerun bool, err error) {
	if rec.Status == StatusRetried {
		return false, nil
	}
	k := attemptKey{rec.GroupID, rec.Attempt}
	prev, seen := a.decided[k]
	if seen && !prev.error {
		return false, &DuplicateFinalError{GroupID: rec.GroupID, Attempt: rec.Attempt, FirstLine: prev.line, Line: line}
	}
	a.decided[k] = decision{line: line, error: rec.Status == StatusError}
	return seen, nil
}
