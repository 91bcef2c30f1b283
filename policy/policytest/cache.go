package policytest

import "container/list"

// BlockSize is the prefix cache's granularity in tokens, vLLM's default.
const BlockSize = 16

// DefaultCacheBlocks is the prefix cache's default capacity in blocks
// (about 500k tokens, the KV cache of a 9B model on one 80 GB GPU).
const DefaultCacheBlocks = 1 << 15

// prefixCache models vLLM's automatic prefix caching: a prompt is cut into
// full blocks of BlockSize tokens, each block is named by the hash of its
// tokens chained with the hash of the block before it, and a prompt reuses
// the leading blocks already cached. Blocks are evicted least recently used
// first. It is not safe for concurrent use.
type prefixCache struct {
	capacity int
	lru      *list.List // of uint64 block hashes; front is most recent
	blocks   map[uint64]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, lru: list.New(), blocks: make(map[uint64]*list.Element)}
}

// serve returns how many leading tokens of a prompt with these keys are
// cached, then caches all its full blocks.
func (c *prefixCache) serve(keys []uint64) (cached int) {
	var h uint64
	hit := true
	for start := 0; start+BlockSize <= len(keys); start += BlockSize {
		for _, k := range keys[start : start+BlockSize] {
			h = mix(h, k)
		}
		if e, ok := c.blocks[h]; ok {
			c.lru.MoveToFront(e)
			if hit {
				cached += BlockSize
			}
			continue
		}
		hit = false
		c.blocks[h] = c.lru.PushFront(h)
		if c.lru.Len() > c.capacity {
			old := c.lru.Back()
			c.lru.Remove(old)
			delete(c.blocks, old.Value.(uint64))
		}
	}
	// The last prompt token is always computed, to get the first logits.
	if cached >= len(keys) && cached > 0 {
		cached = (len(keys) - 1) / BlockSize * BlockSize
	}
	return cached
}
