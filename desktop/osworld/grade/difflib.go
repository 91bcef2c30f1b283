package grade

// diff_text_file scores with Python's difflib.SequenceMatcher(a, b).ratio()
// over lines. The ratio depends on which longest match the algorithm picks
// first (it recurses left and right of it), so this is the same algorithm,
// with the same tie-breaking and the same "autojunk" heuristic, not just any
// longest-common-subsequence measure.

// matchRatio returns 2·M / (len(a)+len(b)), M being the number of elements
// in the matching blocks SequenceMatcher finds; 1 when both are empty.
func matchRatio(a, b []string) float64 {
	total := len(a) + len(b)
	if total == 0 {
		return 1
	}
	return 2 * float64(matchingElements(a, b)) / float64(total)
}

func matchingElements(a, b []string) int {
	// Index b: element → ascending positions. With autojunk (on by default),
	// when b has 200 or more elements, an element occurring more than
	// len(b)/100 + 1 times is "popular" and dropped from the index, so it
	// never starts a match (matches may still extend over it).
	b2j := make(map[string][]int)
	for j, s := range b {
		b2j[s] = append(b2j[s], j)
	}
	if n := len(b); n >= 200 {
		limit := n/100 + 1
		for s, js := range b2j {
			if len(js) > limit {
				delete(b2j, s)
			}
		}
	}

	type span struct{ alo, ahi, blo, bhi int }
	queue := []span{{0, len(a), 0, len(b)}}
	matched := 0
	for len(queue) > 0 {
		sp := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		i, j, k := longestMatch(a, b, b2j, sp.alo, sp.ahi, sp.blo, sp.bhi)
		if k == 0 {
			continue
		}
		matched += k
		if sp.alo < i && sp.blo < j {
			queue = append(queue, span{sp.alo, i, sp.blo, j})
		}
		if i+k < sp.ahi && j+k < sp.bhi {
			queue = append(queue, span{i + k, sp.ahi, j + k, sp.bhi})
		}
	}
	return matched
}

// longestMatch is SequenceMatcher.find_longest_match without an isjunk
// function: the longest block a[i:i+k] == b[j:j+k] inside the given ranges,
// the earliest in a, then in b, among the longest; then extended over equal
// elements at both ends (which only matters for popular elements).
func longestMatch(a, b []string, b2j map[string][]int, alo, ahi, blo, bhi int) (int, int, int) {
	besti, bestj, bestk := alo, blo, 0
	// runs[j] is the length of the match ending at a[i-1] and b[j].
	runs := map[int]int{}
	for i := alo; i < ahi; i++ {
		next := map[int]int{}
		for _, j := range b2j[a[i]] {
			if j < blo {
				continue
			}
			if j >= bhi {
				break
			}
			k := runs[j-1] + 1
			next[j] = k
			if k > bestk {
				besti, bestj, bestk = i-k+1, j-k+1, k
			}
		}
		runs = next
	}
	for besti > alo && bestj > blo && a[besti-1] == b[bestj-1] {
		besti, bestj, bestk = besti-1, bestj-1, bestk+1
	}
	for besti+bestk < ahi && bestj+bestk < bhi && a[besti+bestk] == b[bestj+bestk] {
		bestk++
	}
	return besti, bestj, bestk
}
