package fake

import (
	"hash/fnv"
	"math/rand/v2"
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

// deriveSeed returns the seed of the gen-th desktop of a fleet slot.
func deriveSeed(seed uint64, slot, gen int) uint64 {
	return mix(mix(seed^mix(uint64(slot)+1)) ^ uint64(gen))
}
