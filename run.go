package rl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"legato/rl/schema"
)

// run drives the batch to its end: D workers, the OnGroup consumer, and the
// ticker that reports progress and refreshes summary.json. It returns the
// final summary.
func (b *batch) run(ctx context.Context) (*Summary, error) {
	b.started = time.Now()
	b.ended = make(chan Group, len(b.groups))
	// runCtx is what the workers see: the caller's ctx, also cancelled
	// when the batch cannot go on (setFatal).
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)

	// Groups that ended in an earlier run of this batch are delivered
	// first.
	b.mu.Lock()
	b.stop = stop
	for _, g := range b.groups {
		if g.left == 0 {
			b.endGroupLocked(g)
		}
	}
	b.resumedEnded = b.groupsEnded
	b.mu.Unlock()

	var consumers sync.WaitGroup
	consumers.Add(1)
	go func() {
		defer consumers.Done()
		for g := range b.ended {
			if b.opts.OnGroup != nil {
				b.opts.OnGroup(g)
			}
		}
	}()

	tickCtx, stopTicker := context.WithCancel(context.WithoutCancel(ctx))
	consumers.Add(1)
	go func() {
		defer consumers.Done()
		b.tick(tickCtx)
	}()

	var workers errgroup.Group
	for slot := range b.opts.Desktops {
		w := &worker{b: b, slot: slot}
		workers.Go(func() error {
			w.run(runCtx)
			return nil
		})
	}
	_ = workers.Wait()

	stopTicker()
	close(b.ended)
	consumers.Wait()

	sum := b.currentSummary(true)
	werr := b.store.WriteSummary(sum)
	if b.opts.Progress != nil {
		b.opts.Progress(b.progress(true))
	}
	b.mu.Lock()
	fatal := b.fatal
	b.mu.Unlock()
	switch {
	case fatal != nil:
		return sum, fatal
	case ctx.Err() != nil:
		return sum, ctx.Err()
	case werr != nil:
		return sum, fmt.Errorf("write summary: %w", werr)
	}
	return sum, b.incompleteErr()
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
			if err := b.store.WriteSummary(b.currentSummary(false)); err != nil {
				b.log.Warn("refresh summary.json", "err", err)
			}
		}
	}
}

// slotLost is called by a worker that could not create a desktop. When no
// worker is left, the attempts still queued cannot run: each gets an env
// error record, so that the batch ends and says why.
func (b *batch) slotLost(cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lostSlots++
	if b.lostSlots < b.opts.Desktops || b.running > 0 {
		return
	}
	queue := b.queue
	b.queue = nil
	for _, a := range queue {
		if a.g.closed {
			b.skipLocked(a)
			continue
		}
		now := time.Now()
		rec := b.newRecord(a, -1, now)
		rec.Status = schema.StatusError
		rec.Error = &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: cause.Error()}
		rec.EndedAt = schema.Time{Time: now}
		a.phase = done
		if err := b.appendLocked(rec); err != nil {
			return
		}
		b.endAttemptLocked(a)
	}
}
