package policytest

import (
	"math"
	"time"
)

// Latency is the server's latency model: a request takes
//
//	(Base + uncached prompt tokens·PerPromptToken + generated tokens·PerToken) · Slowdown(n)
//
// where n is the number of requests in flight when it arrives. Slowdown
// grows smoothly so that latency doubles at Knee requests and throughput
// (n per latency) peaks at 1.5·Knee; past Capacity the KV cache is full,
// requests get preempted and recomputed, and throughput collapses. The
// defaults are shaped like one H100 serving a 9B vision-language model:
// latency doubles near 32 in flight, throughput peaks near 48 and collapses
// past 64.
//
// The model sleeps with the time package, so under testing/synctest it
// costs no wall time.
type Latency struct {
	Base           time.Duration
	PerPromptToken time.Duration
	PerToken       time.Duration
	// Knee is the in-flight count at which latency has doubled; zero means
	// the default, 32.
	Knee int
	// Capacity is the in-flight count past which throughput collapses; zero
	// means the default, 64.
	Capacity int
}

// DefaultLatency returns the H100-shaped model used when Options.Latency is
// zero.
func DefaultLatency() Latency {
	return Latency{
		Base:           40 * time.Millisecond,
		PerPromptToken: 20 * time.Microsecond,
		PerToken:       12 * time.Millisecond,
		Knee:           32,
		Capacity:       64,
	}
}

// kneeExponent p makes n/(1+(n/knee)^p) peak at n = 1.5·knee: the peak
// solves 1.5^p·(p-1) = 1.
const kneeExponent = 1.5364

// collapseWidth is how many requests past capacity, as a share of capacity,
// add one more full latency: preemption recomputes whole prompts.
const collapseWidth = 1.0 / 8

func (l Latency) withDefaults() Latency {
	if l == (Latency{}) {
		return DefaultLatency()
	}
	d := DefaultLatency()
	if l.Knee <= 0 {
		l.Knee = d.Knee
	}
	if l.Capacity <= 0 {
		l.Capacity = d.Capacity
	}
	return l
}

// Slowdown is the factor by which n requests in flight stretch the latency
// of each one.
func (l Latency) Slowdown(n int) float64 {
	l = l.withDefaults()
	f := 1 + math.Pow(float64(n)/float64(l.Knee), kneeExponent)
	if n > l.Capacity {
		f *= 1 + float64(n-l.Capacity)/(collapseWidth*float64(l.Capacity))
	}
	return f
}

// Duration is the latency of a request that arrives with n requests in
// flight (itself included), has uncached prompt tokens to prefill and
// generates generated tokens.
func (l Latency) Duration(n, uncached, generated int) time.Duration {
	l = l.withDefaults()
	work := l.Base + time.Duration(uncached)*l.PerPromptToken + time.Duration(generated)*l.PerToken
	return time.Duration(float64(work) * l.Slowdown(n))
}
