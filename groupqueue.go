package rl

import (
	"sync"

	"legato/rl/export"
	"legato/rl/schema"
)

// Group is a task's group of attempts when it ends, for a trainer that
// consumes a batch while it runs.
type Group struct {
	ID     string
	TaskID string
	// Closed is true when G attempts finished; false when the group ended
	// short because attempts failed for good, or was dropped.
	Closed bool
	// Dropped is true when its caller cancelled the group (a service's
	// DELETE) before G attempts finished.
	Dropped bool
	// Finished are the records of the finished (ok, truncated) attempts
	// that count for the group, at most G, in the order rollouts.jsonl
	// holds them: a resumed batch delivers a group as the first run did.
	Finished []Record
	// Advantages[i] is the GRPO advantage of Finished[i]: (reward − mean) /
	// std over Finished, 0 when all rewards are equal, where std is
	// AdvantageStd, the batch's (CollectOptions.AdvantageStd).
	Advantages   []float64
	AdvantageStd schema.AdvantageStd
}

// groupQueue hands ended groups from the scheduler, which pushes under its
// lock and must never wait, to the one goroutine that delivers them, in
// order. It is unbounded: a service adds groups while it runs, so no
// buffer size fixed at the start would do.
type groupQueue struct {
	mu     sync.Mutex
	items  []Group
	closed bool
	ready  chan struct{} // holds a token while items or closed may be news
}

func newGroupQueue() *groupQueue { return &groupQueue{ready: make(chan struct{}, 1)} }

func (q *groupQueue) push(g Group) {
	q.mu.Lock()
	q.items = append(q.items, g)
	q.mu.Unlock()
	q.signal()
}

// close makes pop return false once the queue is empty.
func (q *groupQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *groupQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop waits for the next group; false when the queue is closed and empty.
func (q *groupQueue) pop() (Group, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			g := q.items[0]
			q.items[0] = Group{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return g, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return Group{}, false
		}
		<-q.ready
	}
}

// groupAdvantages wraps export.Advantages for the records of a group.
func groupAdvantages(recs []Record, kind schema.AdvantageStd) []float64 {
	rewards := make([]float64, len(recs))
	for i, r := range recs {
		if r.Reward != nil {
			rewards[i] = *r.Reward
		}
	}
	return export.Advantages(rewards, kind)
}
