package schema

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
// resume, export, replay, regrade, repair) decides which record is an
// attempt's: records are taken in file order; a retried record never decides an attempt; an error
// record does until a later record of a rerun replaces it (a resume reruns
// error records); any other final record (ok, truncated, surplus, skipped)
// is the attempt's last word, and a later final record of the same attempt
// is an error: legato's writer never makes one, so the file was edited or
// two collects wrote to it, and a trainer would count the attempt twice in
// its group's advantages. The zero value is not ready; use NewAttemptRule.
type AttemptRule struct {
	decided map[attemptKey]decision
	groups  map[string]*groupTally
}

// groupTally counts a group's attempts decided so far: final is those with
// a final record, finished those of them that finished (ok or truncated).
type groupTally struct {
	final, finished int
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
	return &AttemptRule{decided: make(map[attemptKey]decision), groups: make(map[string]*groupTally)}
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
	g := a.groups[rec.GroupID]
	if g == nil {
		g = &groupTally{}
		a.groups[rec.GroupID] = g
	}
	if !seen {
		g.final++
	}
	if rec.Status.Finished() {
		// Never replaced: only an error record is, and a finished one
		// replaces it at most.
		g.finished++
	}
	return seen, nil
}

// GroupEnded reports whether group ended by the scheduler's rule, with the
// records taken so far, in a batch of groups of size finished attempts run
// with attempts attempts each (batch.json's group and attempts_per_task);
// see GroupEnded.
func (a *AttemptRule) GroupEnded(group string, size, attempts int) bool {
	g := a.groups[group]
	if g == nil {
		return GroupEnded(0, 0, size, attempts)
	}
	return GroupEnded(g.finished, g.final, size, attempts)
}

// GroupEnded is the scheduler's rule for the end of a group, read from its
// records: of a group that closes at size finished attempts and runs
// attempts attempts (size plus oversampling), finished finished and final
// have a final record (retried ones aside; an error record a rerun
// replaced counts once). It ended when size finished: it closed, and its
// other attempts are cancelled, skipped or surplus, or have no record
// yet, which resume then skips. It ended too when every attempt has a
// final record with fewer finished: the batch gave up on the rest (errors
// after their retries, a caller's drop) and recorded so. Any other group
// was cut short, by a signal or a crash: resume runs its missing attempts,
// and advantages over the attempts it has would be those of another,
// smaller group. A size of 0 (a batch.json that does not say) judges
// nothing: every group ended.
func GroupEnded(finished, final, size, attempts int) bool {
	return size <= 0 || finished >= size || final >= max(attempts, size)
}

// ErrDamagedRecords is wrapped by the error of a reader of a run's
// attempts (RunAttempts) that found an unreadable line of rollouts.jsonl
// other than the last one.
var ErrDamagedRecords = errors.New("unreadable record in the middle of the file")

// RunAttempts is how every reader of a run directory's attempts (export,
// replay, regrade) reads its records: Add takes each record in file order
// by AttemptRule, refusing a second final record of an attempt, and Done,
// once the file is read, refuses a damaged line. Both errors name the line
// and advise `legato rl repair`. A torn last line is no damage: a crash
// mid-append leaves it, and its attempt runs again on resume.
type RunAttempts struct {
	dir  string
	rule *AttemptRule
}

// NewRunAttempts returns a reader of the attempts of the run directory dir
// (which its errors name) that has taken no record.
func NewRunAttempts(dir string) *RunAttempts {
	return &RunAttempts{dir: dir, rule: NewAttemptRule()}
}

// Add takes rec, read from line of rollouts.jsonl, and reports whether it
// replaces an earlier error record of its attempt (AttemptRule.Add). A
// second final record of an attempt is a *DuplicateFinalError.
func (r *RunAttempts) Add(rec *Record, line int) (rerun bool, err error) {
	rerun, err = r.rule.Add(rec, line)
	if err != nil {
		return false, fmt.Errorf("%w; run `legato rl repair %s` to move the later record to %s (the first is the one collect kept)",
			err, r.dir, QuarantineFile)
	}
	return rerun, nil
}

// Done is the check once every record is read, with the read's stats: an
// unreadable line that is not the last one is an error wrapping
// ErrDamagedRecords and the *LineError naming it.
func (r *RunAttempts) Done(rs ReadStats) error {
	torn := rs.TornInside()
	if torn == nil {
		return nil
	}
	return fmt.Errorf("%w: %w; the line is not the last one, so it is not a crash mid-append but damage, "+
		"and the record it held is lost (its group's advantages would change): run `legato rl repair %s` "+
		"to move it to %s (nothing is deleted) and read the run again",
		ErrDamagedRecords, torn, r.dir, QuarantineFile)
}

// GroupEnded is AttemptRule.GroupEnded over the records added so far.
func (r *RunAttempts) GroupEnded(group string, size, attempts int) bool {
	return r.rule.GroupEnded(group, size, attempts)
}

// ReadRunAttempts reads dir/rollouts.jsonl by RunAttempts, calling fn with
// each record. The file is read as it was when opened:
// records appended meanwhile are left for the next read.
func ReadRunAttempts(dir string, fn func(rec Record) error) (ReadStats, error) {
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	ra := NewRunAttempts(dir)
	rs, err := ReadRecordLines(io.NewSectionReader(f, 0, fi.Size()), func(rec Record, line int) error {
		if _, err := ra.Add(&rec, line); err != nil {
			return err
		}
		return fn(rec)
	})
	if err != nil {
		return rs, err
	}
	return rs, ra.Done(rs)
}
