package rl

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/export"
	"legato/rl/policy"
	"legato/rl/schema"
)

// scheduler is the queue and the state of every group and attempt of one
// batch, under one mutex. Workers take attempts with next and hand back how
// each try ended with settle; records are written outside the lock, between
// settle and recorded.
type scheduler struct {
	maxTries int // tries of an attempt that desktop failures may take
	// open keeps the scheduler taking groups after the ones it began with
	// (a service): workers wait for work instead of ending when the queue
	// is empty, until stop.
	open bool
	// keptEndStates are the end states the records read by resume
	// kept, oldest first, for the batch's bound on their space.
	keptEndStates []desktop.EndState

	mu      sync.Mutex
	wake    *sync.Cond
	groups  []*group
	queue   []*attempt // front first
	running int        // attempts taken from the queue whose try has not been recorded
	// committing counts the running attempts in phase committing: they
	// need no desktop again.
	committing int
	slots      int  // workers that still have a desktop slot
	stopped    bool // the batch is stopping: no attempt starts
	counts     map[Status]int
	summary    *export.SummaryBuilder

	// errorReruns is the batch's bound on reruns of an error record
	// (batch.json), whatever this run does.
	errorReruns int
	// advStd is the std of the batch's advantages (batch.json, a
	// service's journal), fixed before the batch runs.
	advStd schema.AdvantageStd

	groupsEnded, groupsClosed int
	// resumedGraded and resumedEnded are what earlier runs of the batch
	// did, left out of this run's rates; reran counts attempts this run
	// runs again after an error record.
	resumedGraded, resumedEnded, reran int

	// ended takes the groups that end, in order, to the OnGroup
	// goroutine; nil until the batch runs. It never blocks the lock.
	ended *groupQueue
	// byID finds a group by its id.
	byID map[string]*group
}

type group struct {
	id      string
	task    Task
	taskSHA string // TaskSHA(task), for its records
	size    int    // G: the finished attempts that close it
	// server is the group's own model server; nil for the batch's.
	server *modelServer
	// harness is the group's own (a service's contiguous history); nil
	// for the batch's.
	harness  policy.Harness
	attempts []*attempt
	// finished holds the first G finished records in the order of their
	// offsets in rollouts.jsonl (finishedAt): the order a resumed batch
	// reads them in. Records committed together reach recorded in any
	// order, so arrival order would hand OnGroup the same group in
	// another order after a resume.
	finished   []Record
	finishedAt []int64
	// reserved counts finished slots taken, including records still being
	// written; it never exceeds G.
	reserved int
	closed   bool // G attempts finished, or dropped
	begun    bool // an attempt left the queue to run
	dropped  bool // cancelled by the caller before G attempts finished
	ended    bool // delivered to OnGroup
	// quarantined: a quarantine held its task at the batch's start, so
	// its attempts without a record never ran.
	quarantined bool
	left        int // attempts without a final record
}

// attemptPhase is where an attempt is; the group's closure treats an
// attempt that is grading differently from one still stepping.
type attemptPhase int

const (
	queued attemptPhase = iota
	stepping
	grading
	// committing: its try ended with a final verdict and its record is on
	// its way to the store (batch.record); its desktop has moved on.
	committing
	// skipping: taken from the queue of a closed group, its skipped
	// record being written; the group does not end before it is.
	skipping
	done
)

type attempt struct {
	g     *group
	index int
	// tries counts the records of earlier tries (retried, and error
	// records a resume reran); tryBase those before the last rerun, so
	// that EnvRetries counts from it.
	tries, tryBase int
	// errors counts the error records in a row that are the attempt's
	// last word: what a resume holds against the batch's ErrorReruns.
	errors int
	// staleRuns counts its tries retried for stale steps; they do not
	// count against EnvRetries.
	staleRuns int
	phase     attemptPhase
	// cancel stops a stepping attempt when its group closes.
	cancel context.CancelCauseFunc
	// final is the offset in rollouts.jsonl of the attempt's latest final
	// record (not retried); -1 while it has none.
	final int64
}

func newScheduler(tasks []Task, pol PolicyConfig, opts CollectOptions) *scheduler {
	s := &scheduler{
		maxTries: opts.EnvRetries + 1,
		slots:    opts.Desktops,
		counts:   make(map[Status]int),
		summary:  export.NewSummaryBuilder(pol.Policy(), len(tasks), len(tasks)),
		byID:     make(map[string]*group, len(tasks)),
	}
	s.wake = sync.NewCond(&s.mu)
	n := AttemptsPerTask(opts.Group, opts.Oversample)
	for _, t := range tasks {
		s.addLocked0(newGroup(groupID(pol.Version, t.ID), t, opts.Group, n))
	}
	return s
}

// newGroup makes a group of n attempts at task t that closes when size of
// them finished.
func newGroup(id string, t Task, size, n int) *group {
	g := &group{id: id, task: t, taskSHA: TaskSHA(t), size: size, left: n, attempts: make([]*attempt, n)}
	for a := range n {
		g.attempts[a] = &attempt{g: g, index: a, final: -1}
	}
	return g
}

// addLocked0 adds a group before the scheduler runs (no queueing: resume
// queues what is left).
func (s *scheduler) addLocked0(g *group) {
	s.groups = append(s.groups, g)
	s.byID[g.id] = g
}

// add adds a group to a running open scheduler and queues its attempts.
// It reports false when the scheduler stopped.
func (s *scheduler) add(g *group) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.addLocked0(g)
	for _, a := range g.attempts {
		s.queue = append(s.queue, a)
	}
	s.wake.Broadcast()
	return true
}

// started reports whether an attempt of group id has left the queue.
func (s *scheduler) started(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.byID[id]
	return g != nil && g.begun
}

// finals returns the offsets in rollouts.jsonl of the final records of
// group id's attempts, in attempt order.
func (s *scheduler) finals(id string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.byID[id]
	if g == nil {
		return nil
	}
	var out []int64
	for _, a := range g.attempts {
		if a.final >= 0 {
			out = append(out, a.final)
		}
	}
	return out
}

// drop ends a group its caller no longer wants: queued attempts are
// skipped, stepping ones cancelled, and grading ones finish as surplus, as
// when a group closes. It reports false when there is no such group.
func (s *scheduler) drop(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.byID[id]
	if g == nil {
		return false
	}
	if g.ended || g.closed {
		return true
	}
	g.dropped = true
	s.closeLocked(g)
	if !anyActive(g) {
		s.endGroupLocked(g)
	}
	s.wake.Broadcast()
	return true
}

// groupID names a task's group in a batch; it includes the policy version so
// that groups of successive batches never collide in a trainer's buffer.
func groupID(version, taskID string) string { return version + "/" + taskID }

// resume reads the records already in the run directory: finished work is
// kept, groups that are already full are closed, and only attempts without
// a final record are queued, with those whose record is an error while
// they have reruns left (reruns < 0: none).
func (s *scheduler) resume(dir string, reruns int) (schema.ReadStats, error) {
	byID := s.byID
	errorsOf := make(map[*attempt]int)
	rule := schema.NewAttemptRule()
	stats, err := schema.ReadRunRecordsAt(dir, func(r schema.Record, line int, off int64) error {
		g := byID[r.GroupID]
		if g == nil || r.Attempt < 0 || r.Attempt >= len(g.attempts) {
			return fmt.Errorf("record %s: group %q attempt %d is not part of this batch", r.RolloutID, r.GroupID, r.Attempt)
		}
		a := g.attempts[r.Attempt]
		g.begun = true
		if r.Status != schema.StatusRetried {
			a.final = off
		}
		s.summary.Add(&r)
		s.counts[r.Status]++
		if es := r.EndState; es != nil && es.Ref != "" {
			s.keptEndStates = append(s.keptEndStates, desktop.EndState{Ref: es.Ref, Bytes: es.Bytes})
		}
		if r.Status.Graded() {
			s.resumedGraded++
		}
		a.tries++
		if isStaleRetry(&r) {
			a.staleRuns++
			a.tryBase++
		}
		// The rule export reads by decides which record is the attempt's.
		rerun, err := rule.Add(&r, line)
		if err != nil {
			return err
		}
		if r.Status == schema.StatusRetried {
			return nil
		}
		if rerun {
			// An error record that an earlier resume reran: this record
			// is the attempt's last word.
			g.left++
		}
		a.phase = done
		g.left--
		if r.Status == schema.StatusError {
			errorsOf[a]++
		} else {
			delete(errorsOf, a)
		}
		if r.Status.Finished() && len(g.finished) < g.size {
			g.addFinished(r, off)
			g.reserved++
		}
		return nil
	})
	if err != nil {
		return stats, fmt.Errorf("resume %s: %w", dir, err)
	}
	for _, g := range s.groups {
		g.closed = g.closed || len(g.finished) >= g.size
		for _, a := range g.attempts {
			a.errors = errorsOf[a]
			if n := errorsOf[a]; n > 0 && !g.closed && n <= reruns {
				a.phase, a.tryBase = queued, a.tries
				g.left++
				s.reran++
			}
			if a.phase == queued {
				s.queue = append(s.queue, a)
			}
		}
	}
	return stats, nil
}

// writeFunc writes the record of a try that never started.
type writeFunc func(*attempt, verdict, ending) (*Record, int64, error)

// next takes the next attempt to run, or returns nil when there is none
// left or ctx is done. Attempts of closed groups are recorded skipped on the
// way, with write; its error stops the batch and is returned. The lock is
// let go while a skip is written: with oversampling every group has some,
// and a record's write waits for a sync other workers must not wait on.
// With place (the worker's desktop, when it is a desktop.Placer; else
// nil) it takes, of the first queued attempts, one its desktop starts
// fastest (pickAttempt).
func (s *scheduler) next(ctx context.Context, write writeFunc, place desktop.Placer) (*attempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if ctx.Err() != nil || s.stopped {
			return nil, nil
		}
		if len(s.queue) > 0 {
			i := s.pickLocked(place)
			a := s.queue[i]
			s.queue = slices.Delete(s.queue, i, i+1)
			// A group whose last needed attempts are committing closes
			// once they are: its queued attempts are skipped, not started.
			if a.g.full() {
				v := s.settleLocked(a, ending{})
				a.phase = skipping
				s.running++ // the batch is not over while it is written
				s.mu.Unlock()
				rec, off, err := write(a, v, ending{})
				s.mu.Lock()
				s.running--
				if err != nil {
					s.stopped = true
					s.wake.Broadcast()
					return nil, err
				}
				s.addLocked(rec)
				a.final = off
				a.tries++
				a.phase = done
				s.endAttemptLocked(a)
				continue
			}
			a.phase = stepping
			a.g.begun = true
			s.running++
			return a, nil
		}
		if s.running == 0 && !s.open {
			return nil, nil // nothing queued and nothing that could be re-queued
		}
		s.wake.Wait()
	}
}

// affinityWindow bounds how far past the queue's front a worker looks for
// an attempt its desktop starts fastest: the groups keep their order but
// for a few attempts.
const affinityWindow = 8

// pickLocked returns the index in the queue of the attempt the worker
// whose desktop is place takes: the front one without a Placer.
func (s *scheduler) pickLocked(place desktop.Placer) int {
	if place == nil {
		return 0
	}
	aff := make([]desktop.Affinity, min(len(s.queue), affinityWindow))
	for i := range aff {
		aff[i] = place.Affinity(s.queue[i].g.task.ID)
	}
	return pickAttempt(aff)
}

// pickAttempt decides which of the first queued attempts a desktop takes,
// given its affinity to each (front first): the first it starts fastest
// (its task's start state is ready where the desktop runs); else the
// first that no other desktop starts faster; else the front one, so that
// no desktop idles while attempts wait.
func pickAttempt(aff []desktop.Affinity) int {
	if i := slices.Index(aff, desktop.HereFaster); i >= 0 {
		return i
	}
	for i, a := range aff {
		if a != desktop.ElsewhereFaster {
			return i
		}
	}
	return 0
}

// setCancel registers how to stop a stepping attempt; it returns the
// number of the try, and false when the group closed already.
func (s *scheduler) setCancel(a *attempt, cancel context.CancelCauseFunc) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.cancel = cancel
	return a.tries, !a.g.closed
}

// startGrading moves a stepping attempt to grading; it reports false when
// its group closed meanwhile: the attempt is then cancelled, not graded.
func (s *scheduler) startGrading(a *attempt) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.g.closed {
		return false
	}
	a.phase = grading
	return true
}

// settle decides what becomes of a try that ended, with what the scheduler
// knows of its group. A finished status takes one of the group's G
// finished slots before the record is written, so no more than G are
// ever recorded finished.
func (s *scheduler) settle(a *attempt, e ending) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.settleLocked(a, e)
	if v.status != "" && v.status != schema.StatusRetried {
		a.phase = committing
		s.committing++
	}
	return v
}

func (s *scheduler) settleLocked(a *attempt, e ending) verdict {
	e.stopped = e.stopped || s.stopped
	e.groupClosed = a.g.full()
	e.triesLeft = a.tries-a.tryBase+1 < s.maxTries
	e.staleLeft = a.staleRuns < maxStaleReruns
	v := decide(e)
	if v.status.Finished() {
		a.g.reserved++
	}
	return v
}

// addFinished adds rec, written at offset off of rollouts.jsonl, to g's
// finished records, in the order of their offsets.
func (g *group) addFinished(rec Record, off int64) {
	i, _ := slices.BinarySearch(g.finishedAt, off)
	g.finished = slices.Insert(g.finished, i, rec)
	g.finishedAt = slices.Insert(g.finishedAt, i, off)
}

// full says whether g has closed or will once the records of its finished
// attempts are written: it needs no more attempts.
func (g *group) full() bool { return g.closed || g.reserved >= g.size }

// recorded updates the attempt's group once its record rec was written
// (written reports whether it was). Retried attempts go back to the front
// of the queue so that their group can still close soon.
func (s *scheduler) recorded(a *attempt, rec *Record, off int64, written bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if a.phase == committing {
		s.committing--
	}
	if !written {
		s.requeueLocked(a)
		return
	}
	s.addLocked(rec)
	if rec.Status != schema.StatusRetried {
		a.final = off
	}
	if isStaleRetry(rec) {
		a.staleRuns++
		a.tryBase++ // not a desktop failure: EnvRetries count on
	}
	a.tries++
	a.noteFinal(rec.Status)
	g := a.g
	if rec.Status.Finished() {
		g.addFinished(*rec, off)
		if len(g.finished) >= g.size {
			s.closeLocked(g)
		}
	}
	if rec.Status == schema.StatusRetried {
		a.phase = queued
		a.cancel = nil
		s.queue = append([]*attempt{a}, s.queue...)
		s.wake.Broadcast()
		return
	}
	a.phase = done
	s.endAttemptLocked(a)
}

// interrupted forgets a try that left no record: it runs again when the
// batch is resumed.
func (s *scheduler) interrupted(a *attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.requeueLocked(a)
}

func (s *scheduler) requeueLocked(a *attempt) {
	a.phase = queued
	a.cancel = nil
	// A closed group waits for no interrupted attempt: on resume it is
	// skipped. The trainer can have the group now.
	if g := a.g; g.closed && !anyActive(g) {
		s.endGroupLocked(g)
	}
	s.wake.Broadcast()
}

// addLocked accounts for a written record.
func (s *scheduler) addLocked(rec *Record) {
	s.counts[rec.Status]++
	s.summary.Add(rec)
}

func (s *scheduler) closeLocked(g *group) {
	g.closed = true
	for _, o := range g.attempts {
		if o.phase == stepping && o.cancel != nil {
			o.cancel(errGroupClosed)
		}
	}
}

// endAttemptLocked counts a final record and ends the group when it has
// none left to wait for.
func (s *scheduler) endAttemptLocked(a *attempt) {
	g := a.g
	g.left--
	if g.left == 0 || (g.closed && !anyActive(g)) {
		s.endGroupLocked(g)
	}
	s.wake.Broadcast()
}

func anyActive(g *group) bool {
	for _, a := range g.attempts {
		if a.phase == stepping || a.phase == grading || a.phase == committing || a.phase == skipping {
			return true
		}
	}
	return false
}

func (s *scheduler) endGroupLocked(g *group) {
	if g.ended {
		return
	}
	g.ended = true
	s.groupsEnded++
	if g.closed && !g.dropped {
		s.groupsClosed++
	}
	if s.ended != nil {
		fin := append([]Record(nil), g.finished...)
		s.ended.push(Group{ID: g.id, TaskID: g.task.ID, Closed: g.closed && !g.dropped, Dropped: g.dropped,
			Finished: fin, Advantages: groupAdvantages(fin, s.advStd), AdvantageStd: s.advStd})
	}
}

// deliverResumed ends, for OnGroup, the groups an earlier run of the batch
// ended already.
func (s *scheduler) deliverResumed(ended *groupQueue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = ended
	for _, g := range s.groups {
		if g.left == 0 {
			s.endGroupLocked(g)
		}
	}
	s.resumedEnded = s.groupsEnded
}

// stop makes next return nil from now on.
func (s *scheduler) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.wake.Broadcast()
}

// workLeft reports whether an attempt is queued, or running and so might be
// re-queued, while the batch goes on.
func (s *scheduler) workLeft(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	// An attempt whose record is committing needs no desktop: only a try
	// still running may come back to the queue.
	return ctx.Err() == nil && !s.stopped && (s.open || len(s.queue) > 0 || s.running > s.committing)
}

// slotLost is called by a worker that gave up its desktop slot for cause.
// When no worker is left, the attempts still queued cannot run: each is
// recorded with write (under the lock: this happens once), so that the
// batch ends and says why.
func (s *scheduler) slotLost(cause error, write writeFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots--
	// Tries still running may need a slot again; records committing do
	// not.
	if s.slots > 0 || s.running > s.committing {
		return nil
	}
	queue := s.queue
	s.queue = nil
	for _, a := range queue {
		if err := s.writeLocked(a, ending{err: cause}, write); err != nil {
			return err
		}
	}
	if s.open {
		// A service with no desktop left would take groups it can never
		// run: it stops, saying why.
		s.stopped = true
		s.wake.Broadcast()
		return cause
	}
	return nil
}

// writeLocked records a try that never started (e says why) and ends its
// attempt. A write that fails stops the batch.
func (s *scheduler) writeLocked(a *attempt, e ending, write writeFunc) error {
	v := s.settleLocked(a, e)
	rec, off, err := write(a, v, e)
	if err != nil {
		s.stopped = true
		s.wake.Broadcast()
		return err
	}
	s.addLocked(rec)
	a.final = off
	a.tries++
	a.noteFinal(rec.Status)
	a.phase = done
	s.endAttemptLocked(a)
	return nil
}

// noteFinal counts an error record in a row, as resume does; another
// final record ends the run of errors.
func (a *attempt) noteFinal(st Status) {
	switch st {
	case schema.StatusError:
		a.errors++
	case schema.StatusRetried:
	default:
		a.errors = 0
	}
}

// rerunnable counts the attempts that collecting into the directory again
// would rerun: their record is an error, their group did not close, and
// they have reruns left under the batch's bound. It mirrors resume.
func (s *scheduler) rerunnable() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, g := range s.groups {
		if g.closed {
			continue
		}
		for _, a := range g.attempts {
			if a.phase == done && a.errors > 0 && a.errors <= s.errorReruns {
				n++
			}
		}
	}
	return n
}

// closedCount counts the groups that have G finished attempts.
func (s *scheduler) closedCount() int {
	n := 0
	for _, g := range s.groups {
		if g.closed && !g.dropped {
			n++
		}
	}
	return n
}

// snapshot returns what progress reports, under the lock.
func (s *scheduler) snapshot(started time.Time) Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := Progress{
		Elapsed:      time.Since(started),
		GroupsTotal:  len(s.groups),
		GroupsEnded:  s.groupsEnded,
		GroupsClosed: s.groupsClosed,
		Counts:       make(map[Status]int, len(s.counts)),
		Running:      s.running,
	}
	graded := 0
	for st, n := range s.counts {
		p.Counts[st] = n
		if st.Graded() {
			graded += n
		}
	}
	// Rates are this run's: a resumed batch did the rest at another time.
	if h := p.Elapsed.Hours(); h > 0 {
		p.RolloutsPerHour = float64(graded-s.resumedGraded) / h
	}
	if ended := p.GroupsEnded - s.resumedEnded; ended > 0 && p.GroupsEnded < p.GroupsTotal {
		per := p.Elapsed / time.Duration(ended)
		p.ETA = per * time.Duration(p.GroupsTotal-p.GroupsEnded)
	}
	return p
}

// maxStaleReruns bounds how often an attempt runs again for stale steps: a
// trainer that switches versions faster than an attempt takes would
// otherwise keep it running for ever; past it the attempt keeps its try
// (and a service leaves its stale steps out of the result).
const maxStaleReruns = 2

func isStaleRetry(rec *Record) bool {
	return rec.Status == schema.StatusRetried && rec.Error != nil && rec.Error.Kind == schema.ErrorStale
}

// holdQuarantined ends, before the batch runs, the groups whose task the
// quarantine holds and that are not closed: their attempts without a
// record never run. It returns their task ids, in order.
func (s *scheduler) holdQuarantined(q *quarantine) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	skip := map[*group]bool{}
	var ids []string
	for _, g := range s.groups {
		if _, ok := q.holds(g.task.ID, g.taskSHA); ok && !g.closed {
			skip[g] = true
			ids = append(ids, g.task.ID)
		}
	}
	if len(skip) == 0 {
		return nil
	}
	kept := s.queue[:0]
	for _, a := range s.queue {
		if !skip[a.g] {
			kept = append(kept, a)
		}
	}
	s.queue = kept
	for g := range skip {
		// The group ends short, as one whose attempts failed for good.
		g.left, g.quarantined = 0, true
	}
	sort.Strings(ids)
	return ids
}
