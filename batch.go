package rl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"legato/rl/export"
	"legato/rl/policy"
	"legato/rl/schema"
)

// batch is the scheduler of one Collect call. Its mutex guards the queue and
// the state of every group and attempt; records are written outside it.
type batch struct {
	tasks   []Task
	pol     PolicyConfig
	opts    CollectOptions
	client  *policy.Client
	harness policy.Harness
	store   *schema.Run
	log     *slog.Logger
	started time.Time

	mu      sync.Mutex
	wake    *sync.Cond
	groups  []*group
	queue   []*attempt // front first
	running int        // attempts taken from the queue and not yet ended
	counts  map[Status]int
	summary *export.SummaryBuilder
	// fatal is why the batch cannot go on (the run store failed, the
	// policy server refused it); stop cancels the workers' ctx with it.
	fatal     error
	stop      context.CancelCauseFunc
	lostSlots int

	groupsEnded  int
	groupsClosed int
	// resumedGraded and resumedEnded are what earlier runs of the batch
	// did, left out of this run's rates.
	resumedGraded int
	resumedEnded  int

	ended chan Group // to the OnGroup goroutine
}

type group struct {
	id       string
	task     Task
	idx      int
	attempts []*attempt
	finished []Record // the first G finished records, in finishing order
	// reserved counts finished slots taken, including records still being
	// written; it never exceeds G.
	reserved int
	closed   bool
	ended    bool
	left     int // attempts without a final record
}

// attemptPhase is where an attempt is; the group's closure treats an
// attempt that is grading differently from one still stepping.
type attemptPhase int

const (
	queued attemptPhase = iota
	stepping
	grading
	done
)

type attempt struct {
	g     *group
	index int
	tries int // tries already recorded as retried
	phase attemptPhase
	// cancel stops a stepping attempt when its group closes.
	cancel          context.CancelFunc
	cancelledByFull bool
}

func newBatch(tasks []Task, pol PolicyConfig, opts CollectOptions, client *policy.Client, h policy.Harness, run *schema.Run) *batch {
	b := &batch{
		tasks:   tasks,
		pol:     pol,
		opts:    opts,
		client:  client,
		harness: h,
		store:   run,
		log:     opts.Logger,
		counts:  make(map[Status]int),
	}
	b.wake = sync.NewCond(&b.mu)
	n := AttemptsPerTask(opts.Group, opts.Oversample)
	for i, t := range tasks {
		g := &group{id: groupID(pol.Version, t.ID), task: t, idx: i, left: n}
		for a := range n {
			g.attempts = append(g.attempts, &attempt{g: g, index: a})
		}
		b.groups = append(b.groups, g)
	}
	b.summary = export.NewSummaryBuilder(schema.Policy{Model: pol.Model, Version: pol.Version}, len(tasks), len(tasks))
	return b
}

// groupID names a task's group in a batch; it includes the policy version so
// that groups of successive batches never collide in a trainer's buffer.
func groupID(version, taskID string) string { return version + "/" + taskID }

// resume reads the records already in the run directory: finished work is
// kept, groups that are already full are closed, and only attempts without a
// final record are queued.
func (b *batch) resume() error {
	byID := make(map[string]*group, len(b.groups))
	for _, g := range b.groups {
		byID[g.id] = g
	}
	stats, err := schema.ReadRunRecords(b.opts.Out, func(r schema.Record) error {
		g := byID[r.GroupID]
		if g == nil || r.Attempt < 0 || r.Attempt >= len(g.attempts) {
			return fmt.Errorf("record %s: group %q attempt %d is not part of this batch", r.RolloutID, r.GroupID, r.Attempt)
		}
		a := g.attempts[r.Attempt]
		b.summary.Add(&r)
		b.counts[r.Status]++
		if r.Status.Graded() {
			b.resumedGraded++
		}
		if r.Status == schema.StatusRetried {
			a.tries++
			return nil
		}
		if a.phase == done {
			return fmt.Errorf("record %s: attempt %d of group %q has two final records", r.RolloutID, r.Attempt, r.GroupID)
		}
		a.phase = done
		g.left--
		if r.Status.Finished() && len(g.finished) < b.opts.Group {
			g.finished = append(g.finished, r)
			g.reserved++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("resume %s: %w", b.opts.Out, err)
	}
	if stats.TornLines > 0 {
		b.log.Warn("skipped unreadable lines in rollouts.jsonl", "lines", stats.TornLines)
	}
	if stats.Records > 0 {
		b.log.Info("resuming batch", "records", stats.Records)
	}
	for _, g := range b.groups {
		if len(g.finished) >= b.opts.Group {
			g.closed = true
		}
		for _, a := range g.attempts {
			if a.phase == queued {
				b.queue = append(b.queue, a)
			}
		}
	}
	return nil
}

// next takes the next attempt to run, or returns nil when there is none
// left or ctx is done. Attempts of closed groups are skipped on the way.
func (b *batch) next(ctx context.Context) *attempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if ctx.Err() != nil || b.fatal != nil {
			return nil
		}
		if len(b.queue) > 0 {
			a := b.queue[0]
			b.queue = b.queue[1:]
			if a.g.closed {
				b.skipLocked(a)
				continue
			}
			a.phase = stepping
			b.running++
			return a
		}
		if b.running == 0 {
			return nil // nothing queued and nothing that could be re-queued
		}
		b.wake.Wait()
	}
}

// skipLocked records an attempt of a closed group that never started.
func (b *batch) skipLocked(a *attempt) {
	now := time.Now()
	rec := b.newRecord(a, -1, now)
	rec.Status = schema.StatusSkipped
	rec.EndedAt = schema.Time{Time: now}
	a.phase = done
	// Appending under the lock is fine here: skips are rare and cheap, and
	// it keeps the group's bookkeeping in one place.
	if err := b.appendLocked(rec); err != nil {
		return
	}
	b.endAttemptLocked(a)
}

// startGrading moves a stepping attempt to grading, unless its group closed
// meanwhile, in which case the attempt is cancelled.
func (b *batch) startGrading(a *attempt) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.g.closed {
		a.cancelledByFull = true
		return false
	}
	a.phase = grading
	return true
}

// end writes an attempt's record and updates its group. Retried attempts go
// back to the front of the queue so that their group can still close soon.
func (b *batch) end(a *attempt, rec *Record) error {
	g := a.g
	b.mu.Lock()
	// The status of a graded attempt is decided here, under the lock, so
	// that no more than G attempts of a group are ever recorded finished:
	// a finished slot is reserved before the record is written, and one
	// that finds none left (it was grading when its group filled) is
	// surplus.
	if rec.Status.Finished() {
		if g.closed || g.reserved >= b.opts.Group {
			rec.Status = schema.StatusSurplus
		} else {
			g.reserved++
		}
	}
	b.mu.Unlock()

	// The write syncs to disk; doing it outside the lock keeps the other
	// workers scheduling meanwhile, and lets the store commit their
	// records together.
	err := b.store.Append(rec)

	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	if err != nil {
		b.setFatalLocked(fmt.Errorf("write record: %w", err))
		return b.fatal
	}
	b.counts[rec.Status]++
	b.summary.Add(rec)
	if rec.Status.Finished() {
		g.finished = append(g.finished, *rec)
		if len(g.finished) >= b.opts.Group {
			b.closeLocked(g)
		}
	}
	if rec.Status == schema.StatusRetried {
		a.tries++
		a.phase = queued
		a.cancel = nil
		a.cancelledByFull = false
		b.queue = append([]*attempt{a}, b.queue...)
		b.wake.Broadcast()
		return nil
	}
	a.phase = done
	b.endAttemptLocked(a)
	return nil
}

// interrupted forgets an attempt that the batch's ctx stopped: it leaves no
// record and runs again when the batch is resumed.
func (b *batch) interrupted(a *attempt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	a.phase = queued
	a.cancel = nil
	a.cancelledByFull = false
	// A closed group waits for no interrupted attempt: on resume it is
	// skipped. The trainer can have the group now.
	if g := a.g; g.closed && !b.anyActiveLocked(g) {
		b.endGroupLocked(g)
	}
	b.wake.Broadcast()
}

// workLeft reports whether an attempt is queued, or running and so might be
// re-queued, while the batch goes on.
func (b *batch) workLeft(ctx context.Context) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return ctx.Err() == nil && b.fatal == nil && (len(b.queue) > 0 || b.running > 0)
}

func (b *batch) closeLocked(g *group) {
	g.closed = true
	for _, o := range g.attempts {
		if o.phase == stepping && o.cancel != nil {
			o.cancelledByFull = true
			o.cancel()
		}
	}
}

// endAttemptLocked counts a final record and ends the group when it has
// none left to wait for.
func (b *batch) endAttemptLocked(a *attempt) {
	g := a.g
	g.left--
	if g.left == 0 || (g.closed && !b.anyActiveLocked(g)) {
		b.endGroupLocked(g)
	}
	b.wake.Broadcast()
}

func (b *batch) anyActiveLocked(g *group) bool {
	for _, a := range g.attempts {
		if a.phase == stepping || a.phase == grading {
			return true
		}
	}
	return false
}

func (b *batch) endGroupLocked(g *group) {
	if g.ended {
		return
	}
	g.ended = true
	b.groupsEnded++
	if g.closed {
		b.groupsClosed++
	}
	if b.ended != nil {
		fin := append([]Record(nil), g.finished...)
		b.ended <- Group{ID: g.id, TaskID: g.task.ID, Closed: g.closed, Finished: fin, Advantages: groupAdvantages(fin)}
	}
}

// appendLocked writes a record; a failure of the run store is fatal for
// the batch, since nothing it does could be kept.
func (b *batch) appendLocked(rec *Record) error {
	if err := b.store.Append(rec); err != nil {
		b.setFatalLocked(fmt.Errorf("write record: %w", err))
		return b.fatal
	}
	b.counts[rec.Status]++
	b.summary.Add(rec)
	return nil
}

// setFatal stops the batch for err: no attempt starts, running ones are
// interrupted (they leave no record), and Collect returns the first such
// error.
func (b *batch) setFatal(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setFatalLocked(err)
}

func (b *batch) setFatalLocked(err error) {
	if b.fatal == nil {
		b.fatal = err
		b.log.Error("batch stopped", "err", err)
		if b.stop != nil {
			b.stop(err)
		}
	}
	b.wake.Broadcast()
}

// setCancel registers how to stop a stepping attempt; it reports false when
// the group already closed.
func (b *batch) setCancel(a *attempt, cancel context.CancelFunc) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	a.cancel = cancel
	if a.g.closed {
		a.cancelledByFull = true
		return false
	}
	return true
}

func (b *batch) wasCancelledByFull(a *attempt) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return a.cancelledByFull
}

func (b *batch) maxTries() int { return b.opts.EnvRetries + 1 }

// newRecord fills the identity of a record for a try of a.
func (b *batch) newRecord(a *attempt, slot int, start time.Time) *Record {
	return &Record{
		Schema:    schema.Version,
		RolloutID: newRolloutID(a.g.task.ID, a.index),
		TaskID:    a.g.task.ID,
		Domain:    a.g.task.Domain,
		GroupID:   a.g.id,
		Attempt:   a.index,
		Policy:    schema.Policy{Model: b.pol.Model, Version: b.pol.Version},
		Desktop:   slot,
		StartedAt: schema.Time{Time: start},
	}
}

func (b *batch) progress(final bool) Progress {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := Progress{
		Elapsed:      time.Since(b.started),
		GroupsTotal:  len(b.groups),
		GroupsEnded:  b.groupsEnded,
		GroupsClosed: b.groupsClosed,
		Counts:       make(map[Status]int, len(b.counts)),
		Running:      b.running,
		InFlight:     b.client.InFlight(),
		Final:        final,
	}
	graded := 0
	for s, n := range b.counts {
		p.Counts[s] = n
		if s.Graded() {
			graded += n
		}
	}
	// Rates are this run's: a resumed batch did the rest at another time.
	if h := p.Elapsed.Hours(); h > 0 {
		p.RolloutsPerHour = float64(graded-b.resumedGraded) / h
	}
	if ended := p.GroupsEnded - b.resumedEnded; ended > 0 && p.GroupsEnded < p.GroupsTotal {
		per := p.Elapsed / time.Duration(ended)
		p.ETA = per * time.Duration(p.GroupsTotal-p.GroupsEnded)
	}
	return p
}

func (b *batch) currentSummary(final bool) *schema.Summary {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.summary.Summary()
	s.Final = final
	s.GroupsClosed = 0
	for _, g := range b.groups {
		if g.closed {
			s.GroupsClosed++
		}
	}
	return s
}

// incompleteErr reports the groups that ended without G finished attempts.
func (b *batch) incompleteErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	short := 0
	for _, g := range b.groups {
		if !g.closed {
			short++
		}
	}
	if short == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d of %d groups did not reach %d finished attempts (see the error records)",
		ErrBatchIncomplete, short, len(b.groups), b.opts.Group)
}

var errNoDesktop = errors.New("no desktop")
