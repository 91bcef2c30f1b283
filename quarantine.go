package rl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"legato/rl/schema"
)

// DefaultQuarantineSetupFails is how many desktops a task's reset must fail
// on before the task is quarantined (and on more than half of its resets:
// see setupUnfit).
const DefaultQuarantineSetupFails = 3

// TaskSHA is the SHA-256 of a task's config as it was read (its raw JSON;
// the task's fields as JSON when it was built in code): the identity of a
// task a record, a quarantine and a replay agree on.
func TaskSHA(t Task) string {
	raw := t.Raw
	if len(raw) == 0 {
		raw, _ = json.Marshal(t)
	}
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])
}

// quarantine is a batch's view of the task quarantine: the tasks it holds
// at the batch's start (skipped), and what the batch sees that puts a task
// in. Every entry goes into the run directory's quarantine.json, and into
// the shared file when the batch was given one.
type quarantine struct {
	runFile, shared string
	run             string
	setupFails      int
	log             *slog.Logger

	mu sync.Mutex
	// held is every task held now: by the files at the start, and by
	// this batch since.
	held *schema.Quarantine
	// resets counts, per task, its tries whose reset failed the desktop
	// (each failed desktop is replaced, so they are as many desktops) and
	// those whose reset passed.
	resets map[string]*taskResets
	added  map[string]string // task id → reason, by this batch
	// before is what the run directory's file held at the start: what
	// earlier runs of the batch (and replays of it) put in, which a
	// resumed batch's summary names with its own.
	before map[string]string
}

// openQuarantine reads the quarantines of a batch into dir: dir's own and,
// if shared is not "", the shared file.
func openQuarantine(dir, shared string, setupFails int, log *slog.Logger) (*quarantine, error) {
	q := &quarantine{runFile: filepath.Join(dir, schema.TaskQuarantineFile), shared: shared, run: dir,
		setupFails: setupFails, log: log, resets: map[string]*taskResets{}, added: map[string]string{}}
	held, err := schema.ReadQuarantine(q.runFile)
	if err != nil {
		return nil, err
	}
	q.before = make(map[string]string, len(held.Tasks))
	for id, e := range held.Tasks {
		q.before[id] = e.Reason
	}
	if shared != "" {
		s, err := schema.ReadQuarantine(shared)
		if err != nil {
			return nil, err
		}
		for id, e := range s.Tasks {
			held.Tasks[id] = e
		}
	}
	q.held = held
	return q, nil
}

// holds returns the entry that holds task id with the config of SHA-256
// sha (TaskSHA), if one does.
func (q *quarantine) holds(id, sha string) (schema.QuarantinedTask, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held.Holds(id, sha)
}

// put quarantines task for reason and reports true, unless this batch did
// already.
func (q *quarantine) put(t Task, reason, evidence string, rollouts ...string) bool {
	q.mu.Lock()
	if _, ok := q.added[t.ID]; ok {
		q.mu.Unlock()
		return false
	}
	e := schema.QuarantinedTask{TaskSHA: TaskSHA(t), Reason: reason, Evidence: evidence, Run: q.run,
		Rollouts: rollouts, Since: schema.Time{Time: time.Now()}}
	q.added[t.ID] = reason
	q.held.Tasks[t.ID] = e
	q.mu.Unlock()
	add := map[string]schema.QuarantinedTask{t.ID: e}
	var errs []error
	for _, path := range []string{q.runFile, q.shared} {
		if path == "" {
			continue
		}
		if _, err := schema.AddQuarantined(path, add); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The summary still names the task; losing the file entry must
		// not lose the batch.
		q.log.Error("could not write the task quarantine", "task", t.ID, "err", err)
	}
	q.log.Warn("task quarantined: later batches skip it and export leaves its samples out", "task", t.ID, "reason", reason, "evidence", evidence)
	return true
}

// observe looks at a try's record for what quarantines its task: a grader
// that disagreed with itself, a reward out of range, a reset that failed
// the task's K-th desktop.
func (q *quarantine) observe(t Task, rec *Record, e ending, setup *setupVerdict) {
	if g := rec.SecondGrade; g != nil && g.Reward != nil && !g.Agrees && rec.Reward != nil {
		q.put(t, schema.QuarantineGraderDisagrees,
			fmt.Sprintf("graded twice on the same end state: reward %v, then %v", *rec.Reward, *g.Reward), rec.RolloutID)
	}
	if errors.Is(e.err, errBadReward) {
		q.put(t, schema.QuarantineRewardOutOfRange, e.err.Error(), rec.RolloutID)
	}
	if setup != nil {
		q.put(t, schema.QuarantineSetupFails, setup.evidence, setup.rollouts...)
	}
}

// setupVerdict is a task found unfit for its setup by countReset, with the
// evidence: the tries whose reset failed.
type setupVerdict struct {
	evidence string
	rollouts []string
}

// countReset counts how a try's reset went, on the worker that ran it, as
// soon as the try ends: counted when its record had committed, a desktop's
// pass could be counted after its next reset's failure (commits end in
// any order), and a flaky fleet looked like a broken task. It returns the
// verdict when this failure makes the task unfit; the caller quarantines
// it once the record is durable (observe).
func (q *quarantine) countReset(t Task, rec *Record, e ending) *setupVerdict {
	switch {
	case e.resetFailed && e.desktopFailed:
		q.mu.Lock()
		r := q.taskResets(t.ID)
		r.failed = append(r.failed, rec.RolloutID)
		ids, passed := slices.Clone(r.failed), r.passed
		// One verdict per task: the failures after it are no evidence
		// of more.
		unfit := !r.unfit && setupUnfit(len(ids), passed, q.setupFails)
		if unfit {
			r.unfit = true
		}
		q.mu.Unlock()
		if unfit {
			return &setupVerdict{fmt.Sprintf("its reset failed on %d desktops and passed on %d; the last failure: %v", len(ids), passed, e.err), ids}
		}
	case e.started && !e.resetFailed:
		q.mu.Lock()
		q.taskResets(t.ID).passed++
		q.mu.Unlock()
	}
	return nil
}

// taskResets are a task's resets in this batch.
type taskResets struct {
	failed []string // rollout ids of the tries whose reset failed the desktop
	passed int
	unfit  bool // countReset gave its verdict
}

// taskResets returns task id's resets, adding them; q.mu is held.
func (q *quarantine) taskResets(id string) *taskResets {
	r := q.resets[id]
	if r == nil {
		r = &taskResets{}
		q.resets[id] = r
	}
	return r
}

// setupUnfit says whether a task is quarantined for its setup, its reset
// having failed the desktop failed times and passed passed times in this
// batch: on k desktops at least, and on more than half of its resets. The
// share keeps a fleet whose resets fail now and then, whatever the task,
// from quarantining a healthy task in a long batch (one in ten failing
// reaches any k given enough attempts); a broken task fails nearly all.
func setupUnfit(failed, passed, k int) bool {
	return failed >= k && failed > passed
}

// batchAdded returns the tasks this batch quarantined, in this run or an
// earlier one into the same directory, with why.
func (q *quarantine) batchAdded() map[string]string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.added)+len(q.before) == 0 {
		return nil
	}
	out := make(map[string]string, len(q.added)+len(q.before))
	maps.Copy(out, q.before)
	maps.Copy(out, q.added)
	return out
}

// quarantineWarning is the summary's warning about tasks held out.
func quarantineWarning(skipped []string) string {
	return fmt.Sprintf("%d tasks were not run because a quarantine holds them (%s): the quarantine file (the run's quarantine.json, or the shared --quarantine file) says why; remove a task's entry once it is fixed",
		len(skipped), strings.Join(skipped, ", "))
}
