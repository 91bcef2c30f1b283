package rl

import (
	"testing"

	"legato/rl/desktop"
)

func TestPickAttempt(t *testing.T) {
	const (
		any  = desktop.AnyDesktop
		here = desktop.HereFaster
		away = desktop.ElsewhereFaster
	)
	for _, tc := range []struct {
		name string
		aff  []desktop.Affinity
		want int
	}{
		{"one attempt", []desktop.Affinity{any}, 0},
		{"nothing known: the front", []desktop.Affinity{any, any, any}, 0},
		{"its host holds a later task's state", []desktop.Affinity{any, away, here}, 2},
		{"the first of two held here", []desktop.Affinity{away, here, here}, 1},
		{"held elsewhere: the first no other host holds", []desktop.Affinity{away, away, any, any}, 2},
		{"all held elsewhere: the front, not idle", []desktop.Affinity{away, away}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickAttempt(tc.aff); got != tc.want {
				t.Errorf("pickAttempt(%v) = %d, want %d", tc.aff, got, tc.want)
			}
		})
	}
}

// hostPlacer is a desktop on a host whose templates are of the tasks in
// here; those of the tasks in away are on another host.
type hostPlacer struct{ here, away map[string]bool }

func (p hostPlacer) Affinity(task string) desktop.Affinity {
	switch {
	case p.here[task]:
		return desktop.HereFaster
	case p.away[task]:
		return desktop.ElsewhereFaster
	}
	return desktop.AnyDesktop
}

// A worker whose desktop's host holds a task's golden state takes that
// task's queued attempt, past the front; a desktop on another host leaves
// it to that host's desktops and takes the front; a desktop that knows
// nothing of hosts takes the front as before.
func TestNextPrefersTheHostHoldingTheGoldenState(t *testing.T) {
	s := newScheduler(nil, PolicyConfig{}, CollectOptions{Group: 1, Desktops: 3})
	for _, id := range []string{"a", "b", "c"} {
		s.add(newGroup(id, Task{ID: id}, 1, 1))
	}
	ctx := t.Context()
	onH := hostPlacer{here: map[string]bool{"c": true}}
	onG := hostPlacer{away: map[string]bool{"a": true}}
	for _, step := range []struct {
		name  string
		place desktop.Placer
		want  string
	}{
		{"desktop on the host holding c", onH, "c"},
		{"desktop on another host than a's", onG, "b"},
		{"desktop without a placer", nil, "a"},
	} {
		a, err := s.next(ctx, nil, step.place)
		if err != nil || a == nil {
			t.Fatalf("%s: next = %v, %v", step.name, a, err)
		}
		if a.g.task.ID != step.want {
			t.Errorf("%s took task %s, want %s", step.name, a.g.task.ID, step.want)
		}
	}
}
