package fake

import (
	"hash/fnv"
	"math/rand/v2"
	"strconv"

	"legato/rl/desktop"
)

// Every random draw gets its own generator, keyed by what it is for and a
// counter, instead of sharing one stream: a draw then does not depend on how
// many other draws came before it, so adding a latency to one phase does not
// change the rewards, and a rerun with the same seed repeats every draw.

// mix scrambles x (SplitMix64's finalizer); it is a bijection, so distinct
// inputs stay distinct.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hashKey hashes the parts of a key, separated so that ("ab", "c") and ("a",
// "bc") differ.
func hashKey(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// draw returns the generator of the n-th draw of kind what for key.
func draw(seed uint64, what, key string, n int) *rand.Rand {
	return rand.New(rand.NewPCG(mix(seed^hashKey(what, key)), mix(uint64(n))))
}

// drawKey is what the draws of one call are keyed on: a seed, the attempt
// the call belongs to ("" outside one) and the call's number.
type drawKey struct {
	seed    uint64
	attempt string
	n       int
}

// draw returns the generator of the draw of kind what for key in the call.
// Outside an attempt it is draw(seed, what, key, n), the draw of a desktop
// that knows no attempts.
func (c drawKey) draw(what, key string) *rand.Rand {
	if c.attempt != "" {
		key += "\x00" + c.attempt
	}
	return draw(c.seed, what, key, c.n)
}

// attemptKey names an attempt in the keys of its draws.
func attemptKey(a desktop.Attempt) string {
	return a.GroupID + "\x00" + a.TaskID + "\x00" + strconv.Itoa(a.Index) + "\x00" + strconv.Itoa(a.Try)
}

// deriveSeed returns the seed of the gen-th desktop of a fleet slot.
func deriveSeed(seed uint64, slot, gen int) uint64 {
	return mix(mix(seed^mix(uint64(slot)+1)) ^ uint64(gen))
}
