package rl

import (
	"context"
	"errors"
	"sync"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// endStateBound keeps a batch's kept end states within their bound on
// space, dropping the oldest.
type endStateBound struct {
	mu    sync.Mutex
	refs  []desktop.EndState // oldest first
	have  map[string]bool    // the refs of refs
	bytes int64
}

// add counts a kept state and returns those to drop, oldest first, to stay
// within max; the newest is never dropped.
func (e *endStateBound) add(s desktop.EndState, max int64) []desktop.EndState {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.have[s.Ref] {
		return nil // the same content, kept once
	}
	if e.have == nil {
		e.have = map[string]bool{}
	}
	e.refs = append(e.refs, s)
	e.have[s.Ref] = true
	e.bytes += s.Bytes
	var drop []desktop.EndState
	for e.bytes > max && len(e.refs) > 1 {
		drop = append(drop, e.refs[0])
		delete(e.have, e.refs[0].Ref)
		e.bytes -= e.refs[0].Bytes
		e.refs = e.refs[1:]
	}
	return drop
}

// keepEndState keeps the try's end state, before its grade, and drops the
// oldest of the batch's beyond their bound. A failure is recorded and the
// attempt goes on to its grade: the agent's work is not lost for it.
func (t *try) keepEndState(ctx context.Context) {
	k, ok := t.d.(desktop.EndStateKeeper)
	if !ok {
		t.rec.EndState = &schema.EndStateRef{Error: "the desktop cannot keep end states (it is not a desktop.EndStateKeeper)"}
		return
	}
	var s desktop.EndState
	err := timed(&t.rec.Timing.EvalS, func() (err error) {
		s, err = k.KeepEndState(ctx, t.rec.RolloutID)
		return err
	})
	if err != nil {
		t.rec.EndState = &schema.EndStateRef{Error: err.Error()}
		return
	}
	t.rec.EndState = &schema.EndStateRef{Ref: s.Ref, Bytes: s.Bytes}
	for _, old := range t.b.kept.add(s, t.b.opts.EndStateBytes) {
		if err := k.DropEndState(ctx, old.Ref); err != nil && !errors.Is(err, desktop.ErrNoEndState) {
			t.b.log.Warn("could not drop a kept end state beyond the bound; it stays", "end_state", old.Ref, "err", err)
		}
	}
}
