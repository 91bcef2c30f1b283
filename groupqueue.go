package rl

import "sync"

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
