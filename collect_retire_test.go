package rl

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
)

// retiringDesktop asks to be replaced once it has graded an attempt, as a
// desktop does whose host left the DNS name the hosts come from.
type retiringDesktop struct {
	desktop.Desktop
	fake *fake.Desktop
}

func (d retiringDesktop) Retiring() bool { return d.fake.Stats().Evaluates > 0 }

// TestCollectReplacesRetiringDesktop: a desktop that asks to be replaced
// finishes its attempt, which is recorded as it ended, and is then closed
// and replaced before its worker takes the next attempt; nothing counts
// it as a failure.
func TestCollectReplacesRetiringDesktop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), policytest.Options{Script: clicksThenDone(2)}, fake.Config{})
		newDesktop := e.opts.NewDesktop
		var once sync.Once
		e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := newDesktop(ctx, slot)
			if err != nil {
				return nil, err
			}
			var out desktop.Desktop = d
			once.Do(func() { out = retiringDesktop{d, e.fleet.Desktops()[0]} })
			return out, nil
		}
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 6}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		ds := e.fleet.Desktops()
		if len(ds) != 3 {
			t.Fatalf("%d desktops made for 2 slots, want 3: the retiring one replaced once", len(ds))
		}
		if st := ds[0].Stats(); st.Evaluates != 1 || st.Closes != 1 {
			t.Errorf("the retiring desktop: %d attempts graded, %d closes; want its one attempt graded, then closed", st.Evaluates, st.Closes)
		}
		checkClosed(t, e.fleet)
	})
}
