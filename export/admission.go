package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"legato/rl/schema"
)

// This file decides which records and groups an export takes: each attempt
// once, quarantined tasks and attempts without their regraded reward left
// out, the groups that never ended (partial groups) left out unless asked
// for; and what it refuses once every record is read (damaged lines,
// broken or missing logprobs), with those errors.

// ErrNotRegraded means an export of regraded rewards met finished
// attempts without one.
var ErrNotRegraded = errors.New("finished attempts without a regraded reward")

// ErrBadLogprobs is wrapped by the error of an export that refused
// samples with broken logprobs; see Options.AllowBadLogprobs.
var ErrBadLogprobs = errors.New("samples with broken logprobs")

// maxNamedRollouts is how many rollouts a BadLogprobsError names.
const maxNamedRollouts = 3

// BadLogprobsError is the error of an export that refused to write samples
// whose logprobs the server sent broken.
type BadLogprobsError struct {
	// Samples is how many of the Total samples to write have broken
	// logprobs: NonFinite of them null, NaN or ±Inf, Mismatch of them not
	// one per token id. They are in RolloutCount rollouts, the first few
	// of which Rollouts names.
	Samples, Total      int
	NonFinite, Mismatch int
	RolloutCount        int
	Rollouts            []string
}

func (e *BadLogprobsError) Error() string {
	return fmt.Sprintf("%d of %d samples have broken logprobs (%d null, NaN or infinite: %s; %d not one per token id: %s), in %d rollouts (%s): "+
		"a trainer computing importance ratios from them would be silently wrong; check the server with legato rl probe, "+
		"or export them anyway with --allow-bad-logprobs (Options.AllowBadLogprobs), which writes them with response_logprobs null and the defect in their warnings",
		e.Samples, e.Total, e.NonFinite, schema.WarnNonFiniteLogprobs, e.Mismatch, schema.WarnLogprobsMismatch, e.RolloutCount, e.rollouts())
}

func (e *BadLogprobsError) rollouts() string {
	s := strings.Join(e.Rollouts, ", ")
	if e.RolloutCount > len(e.Rollouts) {
		s += ", …"
	}
	return s
}

func (e *BadLogprobsError) Unwrap() error { return ErrBadLogprobs }

// ErrMissingLogprobs is wrapped by the error of an export that refused
// samples without logprobs; see Options.AllowMissingLogprobs.
var ErrMissingLogprobs = errors.New("samples without logprobs")

// MissingLogprobsError is the error of an export that refused to write
// samples without logprobs.
type MissingLogprobsError struct {
	// Samples is how many of the Total samples to write have no logprobs;
	// FirstRollout and FirstStep name the first of them.
	Samples, Total int
	FirstRollout   string
	FirstStep      int
}

func (e *MissingLogprobsError) Error() string {
	return fmt.Sprintf("%d of %d samples have no logprobs (the first: rollout %s step %d): the model server returned none, "+
		"so a trainer cannot compute importance ratios from them; ask the server for logprobs (legato rl probe checks it), "+
		"or export them anyway with --allow-missing-logprobs (Options.AllowMissingLogprobs)",
		e.Samples, e.Total, e.FirstRollout, e.FirstStep)
}

func (e *MissingLogprobsError) Unwrap() error { return ErrMissingLogprobs }

// ErrDamagedRecords is wrapped by the error of an export that found an
// unreadable line of rollouts.jsonl other than the last one. It is
// schema.ErrDamagedRecords: replay and regrade read a run by the same rule
// (schema.RunAttempts) and refuse with the same error.
var ErrDamagedRecords = schema.ErrDamagedRecords

// groupShape is a batch's groups as batch.json gives them: size finished
// attempts close one, which runs attempts attempts. The zero value, when
// batch.json is absent or does not say, judges no group cut short.
type groupShape struct {
	size, attempts int
}

// errLeavesGroupsOut is a one-pass export's check meeting groups to leave
// out, whose samples it wrote: the export is done again in two passes.
var errLeavesGroupsOut = errors.New("export leaves groups out: two passes")

// recheck reads r from its start with a fresh admission like a's and
// returns the error admitting the records or checking them gives.
func recheck(ctx context.Context, r *io.SectionReader, a *admission, opts Options) (schema.ReadStats, error) {
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return schema.ReadStats{}, err
	}
	fresh := newAdmission(a.runDir, a.held, a.regraded, a.shape, &Stats{})
	fresh.patching = a.patching
	rs, err := schema.ReadRecordLinesWith(r, readOptions(opts), func(rec schema.Record, line int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, err := fresh.admit(&rec, line)
		return err
	})
	if err != nil {
		return rs, err
	}
	return rs, fresh.check(rs, opts, fresh.st)
}

// admission decides, record by record in the file's order, which records
// an export takes: each attempt once (or the run is refused), quarantined
// tasks left out, regraded rewards in place of recorded ones. It keeps the
// groups' rewards and their logprob counts for the checks made once every
// record is read, which leave out the groups that never ended.
type admission struct {
	runDir      string
	held        heldTasks
	regraded    map[string]float64
	shape       groupShape
	attempts    *schema.RunAttempts
	groups      *groupTable
	heldSeen    map[string]bool
	notRegraded []string
	st          *Stats
	// patching: a one-pass export, which has written every group's
	// samples by the time check knows which to leave out.
	patching bool
}

// newAdmission returns an admission that has taken no record yet, of a
// batch whose groups have the given shape, and counts what it leaves out
// in st.
func newAdmission(runDir string, held heldTasks, regraded map[string]float64, shape groupShape, st *Stats) *admission {
	return &admission{runDir: runDir, held: held, regraded: regraded, shape: shape, attempts: schema.NewRunAttempts(runDir),
		groups: newGroupTable(), heldSeen: map[string]bool{}, st: st}
}

// admit takes rec, read from line, and reports whether it is a finished
// attempt with a reward, whose samples an export writes (unless its group
// is dropped). A rerun error record is no record to write, and a second
// final record of an attempt is an error.
func (a *admission) admit(rec *schema.Record, line int) (bool, error) {
	// The rule collect's resume reads by: a trainer must get the
	// attempts collect counted, each once.
	if _, err := a.attempts.Add(rec, line); err != nil {
		return false, err
	}
	if a.held.holds(rec) {
		a.st.QuarantinedRecords++
		a.heldSeen[rec.TaskID] = true
		return false, nil
	}
	if a.regraded != nil && rec.Status.Finished() && rec.Reward != nil {
		r, ok := a.regraded[rec.RolloutID]
		if !ok {
			a.notRegraded = append(a.notRegraded, rec.RolloutID)
			return false, nil
		}
		rec.Reward = &r
		a.st.RegradedRewards++
	}
	if !a.groups.add(rec) {
		if rec.Status.Finished() {
			a.st.MissingReward++
		}
		return false, nil
	}
	return true, nil
}

// doomed reports whether the records admitted so far make check fail
// whatever follows: a sample with broken or missing logprobs that opts do
// not allow, or a finished attempt without its regraded reward. (Without
// DropConstantGroups, which leaves groups out only at the end.)
func (a *admission) doomed(opts Options) bool {
	return len(a.notRegraded) > 0 || !opts.AllowBadLogprobs && a.groups.bad > 0 || !opts.AllowMissingLogprobs && a.groups.missing > 0
}

// check is what an export refuses once every record is read: a damaged
// line, finished attempts without their regraded reward, samples with
// broken or missing logprobs (unless opts allow them). It computes the
// groups' advantages, and which groups never ended (left out unless
// opts.PartialGroups); a one-pass export that must leave some out
// fails with errLeavesGroupsOut.
func (a *admission) check(rs schema.ReadStats, opts Options, st *Stats) error {
	if err := a.attempts.Done(rs); err != nil {
		return err
	}
	if len(a.notRegraded) > 0 {
		return fmt.Errorf("%w: %d (%s): regrade them (legato rl regrade; their end states must have been kept) or export the recorded rewards",
			ErrNotRegraded, len(a.notRegraded), strings.Join(a.notRegraded[:min(3, len(a.notRegraded))], ", "))
	}
	a.groups.finish(opts.AdvantageStd)
	st.GroupSize = a.shape.size
	for _, g := range a.groups.order {
		if !a.attempts.GroupEnded(g, a.shape.size, a.shape.attempts) {
			st.PartialGroups = append(st.PartialGroups, g)
			if !opts.PartialGroups {
				a.groups.leftOut[g] = true
			}
		}
	}
	if len(a.groups.leftOut) > 0 && a.patching {
		return errLeavesGroupsOut
	}
	if bad := a.groups.badLogprobs(opts.DropConstantGroups); bad.Samples > 0 {
		if !opts.AllowBadLogprobs {
			return &bad
		}
		st.BadLogprobs = bad.Samples
	}
	if miss := a.groups.missingLogprobs(opts.DropConstantGroups); miss.Samples > 0 {
		if !opts.AllowMissingLogprobs {
			return &miss
		}
		st.MissingLogprobs = miss.Samples
	}
	return nil
}
