package rl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

// batch is one Collect call: what it runs with, and the goroutines that run
// it (this file). The scheduler holds the state of groups and attempts.
type batch struct {
	tasks   []Task
	pol     PolicyConfig
	opts    CollectOptions
	client  *policy.Replicas
	harness policy.Harness
	store   *schema.Run
	log     *slog.Logger
	sched   *scheduler
	gate    *policyGate
	// stale, if set, says whether a graded try's steps are too old for its
	// service's trainer, which wants such attempts run again.
	stale func(*Record) bool
	// main is the batch's model server now (client, outage and pol); a
	// service's trainer may move it (moveMain). mains lists every one the
	// batch had, for the totals and to close them; ready is closed once
	// run set up the first.
	main   atomic.Pointer[modelServer]
	mains  []*modelServer
	ready  chan struct{}
	runCtx context.Context
	probes sync.WaitGroup
	// commits are the records handed to the store and not yet durable
	// (record).
	commits sync.WaitGroup
	started time.Time
	// earlier is what the batch's earlier runs left in summary.json that
	// its records do not hold: outages and stops (see earlierRuns).
	earlier schema.Summary
	// quar is the task quarantine; skipped the tasks it held at a
	// collect's start, which the batch does not run (a service refuses
	// groups of held tasks instead).
	quar    *quarantine
	skipped []string
	// kept bounds the space of the batch's kept end states.
	kept endStateBound

	// stop cancels the workers' ctx with why the batch cannot go on.
	stop context.CancelCauseFunc
	mu   sync.Mutex
	// fatal is the first reason the batch stopped on its own.
	fatal error

	// warned* make each data-quality warning appear once during the run.
	warnedLogprobs, warnedTokenIDs          atomic.Bool
	warnedNonFiniteLogprobs, warnedMismatch atomic.Bool
}

// run drives the batch to its end: D workers, the outage prober, the
// OnGroup consumer, and the ticker that reports progress and refreshes
// summary.json. It returns the final summary.
func (b *batch) run(ctx context.Context) (*Summary, error) {
	if b.started.IsZero() {
		// A service sets it before run: its Status reads it meanwhile.
		b.started = time.Now()
	}
	// runCtx is what the workers see: the caller's ctx, also cancelled
	// when the batch cannot go on (fail).
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	b.mu.Lock()
	b.stop = stop
	b.mu.Unlock()
	first := b.newMain(b.client, b.pol)
	b.main.Store(first)
	b.mu.Lock()
	b.mains, b.runCtx = []*modelServer{first}, runCtx
	b.mu.Unlock()
	if b.ready != nil {
		close(b.ready)
	}
	// Workers of an open scheduler wait for work with nothing running:
	// only a broadcast makes them see that ctx ended.
	defer context.AfterFunc(runCtx, b.sched.stop)()

	ended := newGroupQueue()
	// Groups that ended in an earlier run of the batch are delivered
	// first.
	b.sched.deliverResumed(ended)

	var helpers sync.WaitGroup
	helpers.Go(func() {
		for {
			g, ok := ended.pop()
			if !ok {
				return
			}
			if b.opts.OnGroup != nil {
				b.opts.OnGroup(g)
			}
		}
	})
	tickCtx, stopTicker := context.WithCancel(context.WithoutCancel(ctx))
	helpers.Go(func() { b.tick(tickCtx) })
	helpers.Go(func() { first.outage.run(runCtx) })

	var workers errgroup.Group
	for slot := range b.opts.Desktops {
		workers.Go(func() error {
			b.work(runCtx, slot)
			return nil
		})
	}
	_ = workers.Wait()
	// Workers wait in the scheduler for running attempts, so none is left
	// uncommitted here unless the batch stopped: its finished tries are
	// still written.
	b.commits.Wait()
	stop(nil) // ends the probers
	stopTicker()
	ended.close()
	helpers.Wait()
	// moveMain adds a server and its prober under b.mu once it saw runCtx
	// live: once this takes the lock, none is being added.
	mains := b.mainServers()
	b.probes.Wait()
	for _, m := range mains[1:] {
		m.client.Close() // the first is the caller's
	}

	b.mu.Lock()
	fatal := b.fatal
	b.mu.Unlock()
	sum := b.summary(true)
	switch {
	case fatal != nil:
		sum.State, sum.StopReason = schema.StateStopped, fatal.Error()
	case ctx.Err() != nil:
		sum.State, sum.StopReason = schema.StateInterrupted, fmt.Sprintf("stopped by its caller (%v); collect again to run what is left", context.Cause(ctx))
	case sum.GroupsClosed+len(b.skipped) < sum.Groups:
		sum.State = schema.StateIncomplete
	default:
		sum.State = schema.StateComplete
	}
	if sum.State == schema.StateStopped || sum.State == schema.StateInterrupted {
		sum.Stops = append(sum.Stops, schema.Stop{State: sum.State, Reason: sum.StopReason})
	}
	werr := b.store.WriteSummary(sum)
	if b.opts.Progress != nil {
		b.opts.Progress(b.progress(true))
	}
	switch {
	case fatal != nil:
		return sum, fatal
	case ctx.Err() != nil:
		return sum, ctx.Err()
	case werr != nil:
		return sum, fmt.Errorf("write summary: %w", werr)
	case sum.State == schema.StateIncomplete:
		return sum, &IncompleteError{Short: sum.Groups - sum.GroupsClosed - len(b.skipped), Groups: sum.Groups, Group: b.opts.Group, Rerunnable: b.sched.rerunnable()}
	}
	return sum, nil
}

// work is one worker's loop: take an attempt, run a try on the slot's
// desktop, record it.
func (b *batch) work(ctx context.Context, slot int) {
	w := &worker{slot: slot, create: b.opts.NewDesktop, workLeft: b.sched.workLeft, log: b.log}
	defer w.discard()
	for {
		d, err := w.desktop(ctx)
		if d == nil {
			if err != nil {
				if ferr := b.sched.slotLost(err, b.writeUnstarted); ferr != nil {
					b.fail(ferr)
				}
			}
			return
		}
		place, _ := d.(desktop.Placer)
		a, err := b.sched.next(ctx, b.writeUnstarted, place)
		if err != nil {
			b.fail(err)
			return
		}
		if a == nil {
			return
		}
		rec, e := b.runTry(ctx, d, a, slot)
		if e.graded && b.stale != nil {
			e.stale = b.stale(rec)
		}
		v := b.sched.settle(a, e)
		if v.replace {
			b.log.Warn("desktop failed", "slot", slot, "task", a.g.task.ID, "attempt", a.index, "status", v.status, "err", e.err)
			w.discard()
		}
		if v.stop != nil {
			b.fail(v.stop)
		}
		if v.status == "" {
			b.sched.interrupted(a)
			continue
		}
		fillOutcome(rec, v, e)
		b.record(a, rec, e)
	}
}

// record hands a finished try's record to the store and returns at once,
// so the desktop takes its next attempt while the record commits with
// those of other desktops (one sync for all, see schema.Run.Append). The
// attempt stays running until its record is durable: only then does the
// scheduler count it (recorded), so a kill before that runs it again on
// resume, as a kill before a synchronous append did. The batch waits for
// every commit before it ends (commits).
func (b *batch) record(a *attempt, rec *Record, e ending) {
	ended := time.Now()
	var setup *setupVerdict
	if b.quar != nil {
		setup = b.quar.countReset(a.g.task, rec, e)
	}
	b.commits.Go(func() {
		off, err := b.store.AppendAt(rec)
		if h := b.opts.OnCommitted; h != nil {
			h(time.Since(ended))
		}
		b.sched.recorded(a, rec, off, err == nil)
		if err != nil {
			b.fail(&storeFailure{fmt.Errorf("write record: %w", err)})
			return
		}
		b.checkData(rec)
		if b.quar != nil {
			b.quar.observe(a.g.task, rec, e, setup)
		}
	})
}

// writeUnstarted records a try that never started (skipped, or no
// desktop); the scheduler calls it under its lock.
func (b *batch) writeUnstarted(a *attempt, v verdict, e ending) (*Record, int64, error) {
	now := time.Now()
	rec := b.newRecord(a, -1, now)
	rec.EndedAt = schema.Time{Time: now}
	fillOutcome(rec, v, e)
	off, err := b.store.AppendAt(rec)
	if err != nil {
		return nil, 0, &storeFailure{fmt.Errorf("write record: %w", err)}
	}
	return rec, off, nil
}

// fillOutcome writes a verdict into the try's record.
func fillOutcome(rec *Record, v verdict, e ending) {
	rec.Status = v.status
	if v.errKind != "" && e.err != nil {
		msg := e.err.Error()
		var pf *policyFailure
		if errors.As(e.err, &pf) {
			msg = pf.err.Error()
		}
		rec.Error = &schema.ErrorInfo{Kind: v.errKind, Message: msg}
	}
	if v.errKind == schema.ErrorStale {
		rec.Error = &schema.ErrorInfo{Kind: v.errKind, Message: "graded with steps of a policy version more than --max-staleness versions behind the one then in force: it runs again"}
	}
	if !v.status.Graded() {
		rec.Reward = nil
	}
}

// fail stops the batch for err: no attempt starts, running ones are
// interrupted (they leave no record), and Collect returns the first such
// error.
func (b *batch) fail(err error) { b.failFrom(nil, err) }

// failFrom is fail for the outage breaker of m, a model server the batch
// had as its own: it stops the batch only while m is the batch's server.
// Once the calls moved to other servers (moveMain, which replaces it under
// b.mu), m's outage is no longer the batch's. nil m: any cause.
func (b *batch) failFrom(m *modelServer, err error) {
	b.mu.Lock()
	if m != nil && b.main.Load() != m {
		b.mu.Unlock()
		return
	}
	first := b.fatal == nil
	if first {
		b.fatal = err
	}
	stop := b.stop
	b.mu.Unlock()
	if !first {
		return
	}
	b.log.Error("batch stopped", "err", err)
	b.sched.stop()
	if stop != nil {
		stop(err)
	}
}

// checkData warns, once per kind during the run, when a record holds steps
// a trainer cannot use as they are, with how many of the record's steps;
// the summary counts them over the batch (and collect prints its warnings
// at the end).
func (b *batch) checkData(rec *Record) {
	var noLogprobs, noIDs, nonFinite, mismatch int
	for i := range rec.Steps {
		st := &rec.Steps[i]
		switch st.LogprobDefect() {
		case schema.WarnNonFiniteLogprobs:
			nonFinite++ // its logprobs were dropped, not missing
		case schema.WarnLogprobsMismatch:
			mismatch++
		default:
			if len(st.Response.Logprobs) == 0 {
				noLogprobs++
			}
		}
		if len(st.Response.TokenIDs) == 0 {
			noIDs++
		}
	}
	warn := func(n int, once *atomic.Bool, msg string) {
		if n > 0 && !once.Swap(true) {
			b.log.Warn(msg, "rollout", rec.RolloutID, "steps", n, "of", len(rec.Steps))
		}
	}
	warn(noLogprobs, &b.warnedLogprobs, "the model server returned no logprobs: these steps are not trainable as they are (summary.json counts them; export refuses them unless --allow-missing-logprobs)")
	warn(noIDs, &b.warnedTokenIDs, "the model server returned no generated token ids: a trainer would have to re-tokenize the text, which is not exact (check the server with legato rl probe)")
	warn(nonFinite, &b.warnedNonFiniteLogprobs, "the model server sent null, NaN or infinite logprobs: these steps are marked "+schema.WarnNonFiniteLogprobs+" and keep no logprobs (summary.json counts them in steps_nonfinite_logprobs; export refuses them unless --allow-bad-logprobs; check the server with legato rl probe)")
	warn(mismatch, &b.warnedMismatch, "the model server sent a number of logprobs other than of token ids: these steps are marked "+schema.WarnLogprobsMismatch+" (summary.json counts them in steps_logprobs_mismatch; export refuses them unless --allow-bad-logprobs; check the server with legato rl probe)")
}

// newRecord fills the identity of a record for a try of a.
func (b *batch) newRecord(a *attempt, slot int, start time.Time) *Record {
	pol := b.server(a).pol.Policy()
	// A service's version changes while it runs: the attempt's is the
	// one in force when it started (each step says its own).
	pol.Version = b.gate.state().Version
	return &Record{
		Schema:    schema.Version,
		RolloutID: newRolloutID(a.g.task.ID, a.index),
		TaskID:    a.g.task.ID,
		Domain:    a.g.task.Domain,
		GroupID:   a.g.id,
		Attempt:   a.index,
		TaskSHA:   a.g.taskSHA,
		Policy:    pol,
		Desktop:   slot,
		StartedAt: schema.Time{Time: start},
	}
}

// tick reports progress and refreshes summary.json until ctx is done.
func (b *batch) tick(ctx context.Context) {
	progress := time.NewTicker(b.opts.ProgressInterval)
	defer progress.Stop()
	summary := time.NewTicker(b.opts.SummaryInterval)
	defer summary.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-progress.C:
			if b.opts.Progress != nil {
				b.opts.Progress(b.progress(false))
			}
		case <-summary.C:
			if err := b.store.WriteSummary(b.summary(false)); err != nil {
				b.log.Warn("refresh summary.json", "err", err)
			}
		}
	}
}

func (b *batch) progress(final bool) Progress {
	p := b.sched.snapshot(b.started)
	p.InFlight = 0
	for _, m := range b.mainServers() {
		p.InFlight += m.client.InFlight()
	}
	p.Final = final
	return p
}

// summary is the batch's summary now.
func (b *batch) summary(final bool) *schema.Summary {
	b.sched.mu.Lock()
	s := b.sched.summary.Summary()
	s.GroupsClosed = b.sched.closedCount()
	b.sched.mu.Unlock()
	s.Policy = b.pol.Policy()
	s.Final = final
	s.State = schema.StateRunning
	s.ServerDownS, s.Outages = b.earlier.ServerDownS, b.earlier.Outages
	for _, m := range b.mainServers() {
		s.ServerDownS += m.outage.downSeconds()
		s.Outages += m.outage.episodes()
	}
	s.Stops = slices.Clone(b.earlier.Stops)
	if len(b.skipped) > 0 {
		s.QuarantineSkipped = b.skipped
		s.Warnings = append(s.Warnings, quarantineWarning(b.skipped))
	}
	if b.quar != nil {
		s.Quarantined = b.quar.batchAdded()
	}
	return s
}

// earlierRuns returns what the summary.json of the batch's earlier runs
// says that its records do not: the outages and the stops, so a resumed
// batch's summary tells its whole story. A summary still saying running is
// a run that ended without its final summary (killed, crashed); it is
// listed as a stop. An unreadable summary.json counts nothing: it is
// advice, the records are the data.
func earlierRuns(dir string, log *slog.Logger) schema.Summary {
	prev, err := schema.ReadSummary(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("earlier summary.json unreadable; the new one counts this run's outages only", "err", err)
		}
		return schema.Summary{}
	}
	earlier := schema.Summary{ServerDownS: prev.ServerDownS, Outages: prev.Outages, Stops: prev.Stops}
	switch {
	case !prev.Final:
		earlier.Stops = append(earlier.Stops, schema.Stop{State: schema.StateRunning,
			Reason: "the run ended without its final summary (killed or crashed)"})
	case len(prev.Stops) == 0 && (prev.State == schema.StateStopped || prev.State == schema.StateInterrupted):
		// Written before summaries listed stops.
		earlier.Stops = []schema.Stop{{State: prev.State, Reason: prev.StopReason}}
	}
	return earlier
}
