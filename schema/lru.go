package schema

import (
	"container/list"
	"sync"
)

// lru is a cache bounded by the summed cost of its values, evicting the
// least recently used. A nil *lru caches nothing. Safe for concurrent use.
type lru[K comparable, V any] struct {
	mu    sync.Mutex
	max   int64
	used  int64
	order list.List // of *lruEntry[K, V], most recent first
	items map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key  K
	val  V
	cost int64
}

// newLRU returns a cache holding up to max cost, or nil when max <= 0.
func newLRU[K comparable, V any](max int64) *lru[K, V] {
	if max <= 0 {
		return nil
	}
	return &lru[K, V]{max: max, items: make(map[K]*list.Element)}
}

func (c *lru[K, V]) get(k K) (V, bool) {
	var zero V
	if c == nil {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[k]
	if !ok {
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry[K, V]).val, true
}

func (c *lru[K, V]) put(k K, v V, cost int64) {
	if c == nil || cost > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		old := e.Value.(*lruEntry[K, V])
		c.used += cost - old.cost
		old.val, old.cost = v, cost
		c.order.MoveToFront(e)
	} else {
		c.items[k] = c.order.PushFront(&lruEntry[K, V]{key: k, val: v, cost: cost})
		c.used += cost
	}
	for c.used > c.max {
		e := c.order.Back()
		old := e.Value.(*lruEntry[K, V])
		c.order.Remove(e)
		delete(c.items, old.key)
		c.used -= old.cost
	}
}

func (c *lru[K, V]) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}
