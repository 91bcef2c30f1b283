package export

import (
	"cmp"
	"slices"
)

// interval is [start, end) in Unix nanoseconds.
type interval struct{ start, end int64 }

// intervalSet accumulates intervals and keeps their union as a sorted list
// of disjoint intervals. New intervals wait in pending until compact, which
// sorts only them and merges them into the union: records arrive roughly
// in time order, and a summary refreshed after every group must not sort
// the whole batch each time.
type intervalSet struct {
	union   []interval // sorted, disjoint, not touching
	pending []interval
	spare   []interval // the previous union, reused by the next compact
}

// compactAt bounds pending, so memory follows the union (which overlapping
// intervals of many desktops shrink) rather than the number added.
const compactAt = 1 << 14

func (s *intervalSet) add(start, end int64) {
	if end <= start {
		return
	}
	s.pending = append(s.pending, interval{start, end})
	if len(s.pending) >= compactAt {
		s.compact()
	}
}

// compact merges pending into union.
func (s *intervalSet) compact() {
	if len(s.pending) == 0 {
		return
	}
	slices.SortFunc(s.pending, func(a, b interval) int { return cmp.Compare(a.start, b.start) })
	merged := slices.Grow(s.spare[:0], len(s.union)+len(s.pending))
	i, j := 0, 0
	for i < len(s.union) || j < len(s.pending) {
		var next interval
		if j == len(s.pending) || (i < len(s.union) && s.union[i].start <= s.pending[j].start) {
			next = s.union[i]
			i++
		} else {
			next = s.pending[j]
			j++
		}
		if n := len(merged); n > 0 && next.start <= merged[n-1].end {
			merged[n-1].end = max(merged[n-1].end, next.end)
			continue
		}
		merged = append(merged, next)
	}
	s.union, s.spare, s.pending = merged, s.union, s.pending[:0]
}

// measure returns the total length of the union in nanoseconds.
func (s *intervalSet) measure() int64 {
	s.compact()
	var n int64
	for _, iv := range s.union {
		n += iv.end - iv.start
	}
	return n
}

// minus returns the length of s's union outside other's union.
func (s *intervalSet) minus(other *intervalSet) int64 {
	s.compact()
	other.compact()
	a, b := s.union, other.union
	var n int64
	j := 0
	for _, iv := range a {
		cur := iv.start
		// Skip the intervals of b that end before this one starts.
		for j < len(b) && b[j].end <= cur {
			j++
		}
		for k := j; k < len(b) && b[k].start < iv.end; k++ {
			if b[k].start > cur {
				n += b[k].start - cur
			}
			cur = max(cur, b[k].end)
			if cur >= iv.end {
				break
			}
		}
		if cur < iv.end {
			n += iv.end - cur
		}
	}
	return n
}
