package export

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// naiveDeparture is departure written plainly, on the whole prompt.
func naiveDeparture(prompt, seq []int64) int {
	for k := range min(len(prompt), len(seq)) {
		if prompt[k] != seq[k] {
			return k
		}
	}
	if len(prompt) < len(seq) {
		return len(prompt)
	}
	return -1
}

// chunked cuts ids into chunks of random lengths.
func chunked(r *rand.Rand, ids []int64) [][]int64 {
	var out [][]int64
	for len(ids) > 0 {
		n := min(1+r.IntN(5), len(ids))
		out = append(out, ids[:n])
		ids = ids[n:]
	}
	return out
}

// TestDeparture holds departure and appendIDsFrom to the plain comparison
// on prompts that extend the sequence, depart from it inside or after
// the chunks it may skip, or are shorter than it.
func TestDeparture(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		seq := make([]int64, r.IntN(12))
		for i := range seq {
			seq[i] = int64(r.IntN(3))
		}
		prompt := slices.Clone(seq)
		switch trial % 4 {
		case 0: // extends seq
		case 1: // changes an id
			if len(prompt) > 0 {
				prompt[r.IntN(len(prompt))] += 7
			}
		case 2: // shorter
			prompt = prompt[:r.IntN(len(prompt)+1)]
		case 3: // shorter and changed
			prompt = prompt[:r.IntN(len(prompt)+1)]
			if len(prompt) > 0 {
				prompt[r.IntN(len(prompt))] += 7
			}
		}
		for range r.IntN(6) {
			prompt = append(prompt, int64(r.IntN(3)))
		}
		chunks := chunked(r, prompt)
		// The chunks departure may skip are those before the first id
		// that differs (the previous prompt's own), never past seq's end.
		want := naiveDeparture(prompt, seq)
		firstDiff := want
		if firstDiff < 0 {
			firstDiff = len(prompt)
		}
		skip, at := 0, 0
		for _, c := range chunks {
			if at+len(c) > min(firstDiff, len(seq)) || r.IntN(3) == 0 {
				break
			}
			at += len(c)
			skip++
		}
		if got := departure(chunks, len(prompt), skip, seq); got != want {
			t.Fatalf("trial %d: departure(%v, skip %d, seq %v) = %d, want %d", trial, chunks, skip, seq, got, want)
		}
		if want < 0 {
			got := appendIDsFrom(slices.Clone(seq), chunks, len(seq))
			if !slices.Equal(got, prompt) {
				t.Fatalf("trial %d: appendIDsFrom(%v, %v) = %v, want %v", trial, seq, chunks, got, prompt)
			}
		}
	}
}
