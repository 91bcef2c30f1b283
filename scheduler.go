package rl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"legato/rl/export"
	"legato/rl/schema"
)

// scheduler is the queue and the state of every group and attempt of one
// batch, under one mutex. Workers take attempts with next and hand back how
// each try ended with settle; records are written outside the lock, between
// settle and recorded.
type scheduler struct {
	g        int // G
	maxTries int // tries of an attempt that desktop failures may take

	mu      sync.Mutex
	wake    *sync.Cond
	groups  []*group
	queue   []*attempt // front first
	running int        // attempts taken from the queue whose try has not been recorded
	slots   int        // workers that still have a desktop slot
	stopped bool       // the batch is stopping: no attempt starts
	counts  map[Status]int
	summary *export.SummaryBuilder

	// errorReruns is the batch's bound on reruns of an error record
	// (batch.json), whatever this run does.
	errorReruns int

	groupsEnded, groupsClosed int
	// resumedGraded and resumedEnded are what earlier runs of the batch
	// did, left out of this run's rates; reran counts attempts this run
	// runs again after an error record.
	resumedGraded, resumedEnded, reran int

	ended chan Group // to the OnGroup goroutine; nil until the batch runs
}

type group struct {
	id       string
	task     Task
	attempts []*attempt
	finished []Record // the first G finished records, in finishing order
	// reserved counts finished slots taken, including records still being
	// written; it never exceeds G.
	reserved int
	closed   bool // G attempts finished
	ended    bool // delivered to OnGroup
	left     int  // attempts without a final record
}

// attemptPhase is where an attempt is; the group's closure treats an
// attempt that is grading differently from one still stepping.
type attemptPhase int

const (
	queued attemptPhase = iota
	stepping
	grading
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
	phase  attemptPhase
	// cancel stops a stepping attempt when its group closes.
	cancel context.CancelCauseFunc
}

func newScheduler(tasks []Task, pol PolicyConfig, opts CollectOptions) *scheduler {
	s := &scheduler{
		g:        opts.Group,
		maxTries: opts.EnvRetries + 1,
		slots:    opts.Desktops,
		counts:   make(map[Status]int),
		summary:  export.NewSummaryBuilder(pol.Policy(), len(tasks), len(tasks)),
	}
	s.wake = sync.NewCond(&s.mu)
	n := AttemptsPerTask(opts.Group, opts.Oversample)
	for _, t := range tasks {
		g := &group{id: groupID(pol.Version, t.ID), task: t, left: n, attempts: make([]*attempt, n)}
		for a := range n {
			g.attempts[a] = &attempt{g: g, index: a}
		}
		s.groups = append(s.groups, g)
	}
	return s
}

// groupID names a task's group in a batch; it includes the policy version so
// that groups of successive batches never collide in a trainer's buffer.
func groupID(version, taskID string) string { return version + "/" + taskID }

// resume reads the records already in the run directory: finished work is
// kept, groups that are already full are closed, and only attempts without
// a final record are queued, with those whose record is an error while
// they have reruns left (reruns < 0: none).
func (s *scheduler) resume(dir string, reruns int) (schema.ReadStats, error) {
	byID := make(map[string]*group, len(s.groups))
	for _, g := range s.groups {
		byID[g.id] = g
	}
	errorsOf := make(map[*attempt]int)
	rule := schema.NewAttemptRule()
	stats, err := schema.ReadRunRecordLines(dir, func(r schema.Record, line int) error {
		g := byID[r.GroupID]
		if g == nil || r.Attempt < 0 || r.Attempt >= len(g.attempts) {
			return fmt.Errorf("record %s: group %q attempt %d is not part of this batch", r.RolloutID, r.GroupID, r.Attempt)
		}
		a := g.attempts[r.Attempt]
		s.summary.Add(&r)
		s.counts[r.Status]++
		if r.Status.Graded() {
			s.resumedGraded++
		}
		a.tries++
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
		if r.Status.Finished() && len(g.finished) < s.g {
			g.finished = append(g.finished, r)
			g.reserved++
		}
		return nil
	})
	if err != nil {
		return stats, fmt.Errorf("resume %s: %w", dir, err)
	}
	for _, g := range s.groups {
		g.closed = len(g.finished) >= s.g
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
type writeFunc func(*attempt, verdict, ending) (*Record, error)

// next takes the next attempt to run, or returns nil when there is none
// left or ctx is done. Attempts of closed groups are recorded skipped on the
// way, with write; its error stops the batch and is returned. The lock is
// let go while a skip is written: with oversampling every group has some,
// and a record's write waits for a sync other workers must not wait on.
func (s *scheduler) next(ctx context.Context, write writeFunc) (*attempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if ctx.Err() != nil || s.stopped {
			return nil, nil
		}
		if len(s.queue) > 0 {
			a := s.queue[0]
			s.queue = s.queue[1:]
			if a.g.closed {
				v := s.settleLocked(a, ending{})
				a.phase = skipping
				s.running++ // the batch is not over while it is written
				s.mu.Unlock()
				rec, err := write(a, v, ending{})
				s.mu.Lock()
				s.running--
				if err != nil {
					s.stopped = true
					s.wake.Broadcast()
					return nil, err
				}
				s.addLocked(rec)
				a.tries++
				a.phase = done
				s.endAttemptLocked(a)
				continue
			}
			a.phase = stepping
			s.running++
			return a, nil
		}
		if s.running == 0 {
			return nil, nil // nothing queued and nothing that could be re-queued
		}
		s.wake.Wait()
	}
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
	return s.settleLocked(a, e)
}

func (s *scheduler) settleLocked(a *attempt, e ending) verdict {
	e.stopped = e.stopped || s.stopped
	e.groupClosed = a.g.closed || a.g.reserved >= s.g
	e.triesLeft = a.tries-a.tryBase+1 < s.maxTries
	v := decide(e)
	if v.status.Finished() {
		a.g.reserved++
	}
	return v
}

// recorded updates the attempt's group once its record rec was written
// (written reports whether it was). Retried attempts go back to the front
// of the queue so that their group can still close soon.
func (s *scheduler) recorded(a *attempt, rec *Record, written bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if !written {
		s.requeueLocked(a)
		return
	}
	s.addLocked(rec)
	a.tries++
	a.noteFinal(rec.Status)
	g := a.g
	if rec.Status.Finished() {
		g.finished = append(g.finished, *rec)
		if len(g.finished) >= s.g {
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
		if a.phase == stepping || a.phase == grading || a.phase == skipping {
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
	if g.closed {
		s.groupsClosed++
	}
	if s.ended != nil {
		fin := append([]Record(nil), g.finished...)
		s.ended <- Group{ID: g.id, TaskID: g.task.ID, Closed: g.closed, Finished: fin, Advantages: groupAdvantages(fin)}
	}
}

// deliverResumed ends, for OnGroup, the groups an earlier run of the batch
// ended already.
func (s *scheduler) deliverResumed(ended chan Group) {
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
	return ctx.Err() == nil && !s.stopped && (len(s.queue) > 0 || s.running > 0)
}

// slotLost is called by a worker that gave up its desktop slot for cause.
// When no worker is left, the attempts still queued cannot run: each is
// recorded with write (under the lock: this happens once), so that the
// batch ends and says why.
func (s *scheduler) slotLost(cause error, write writeFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots--
	if s.slots > 0 || s.running > 0 {
		return nil
	}
	queue := s.queue
	s.queue = nil
	for _, a := range queue {
		if err := s.writeLocked(a, ending{err: cause}, write); err != nil {
			return err
		}
	}
	return nil
}

// writeLocked records a try that never started (e says why) and ends its
// attempt. A write that fails stops the batch.
func (s *scheduler) writeLocked(a *attempt, e ending, write writeFunc) error {
	v := s.settleLocked(a, e)
	rec, err := write(a, v, e)
	if err != nil {
		s.stopped = true
		s.wake.Broadcast()
		return err
	}
	s.addLocked(rec)
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
		if g.closed {
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
