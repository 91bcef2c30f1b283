package rl

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// replicaBatch runs 6 tasks × G=4 over two scripted replicas on loopback.
// With killAfter > 0, the first replica is closed once it has served that
// many requests.
func replicaBatch(t *testing.T, routing policy.Routing, killAfter int) (*Summary, []schema.Record, [2]*policytest.Server) {
	t.Helper()
	var srvs [2]*policytest.Server
	// The first replica's killAfter-th request starts its Close (from
	// outside the handler: Close waits for handlers).
	kill := make(chan struct{})
	var killOnce sync.Once
	for i := range srvs {
		o := policytest.Options{Model: "m", NoLatency: true, Script: clicksThenDone(5)}
		if i == 0 && killAfter > 0 {
			o.Faults = func(n int, _ policytest.Request) policytest.Fault {
				if n+1 >= killAfter {
					killOnce.Do(func() { close(kill) })
				}
				return policytest.NoFault
			}
		}
		srvs[i] = policytest.NewServer(o)
		t.Cleanup(srvs[i].Close)
	}
	if killAfter > 0 {
		done := make(chan struct{})
		t.Cleanup(func() { <-done })
		go func() {
			defer close(done)
			select {
			case <-kill:
				srvs[0].Close()
			case <-t.Context().Done():
			}
		}()
	}
	fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, DefaultReward: fake.Reward{P: 0.5}})
	opts := CollectOptions{Out: filepath.Join(t.TempDir(), "run"), NewDesktop: fleet.New, Desktops: 4, Group: 4,
		Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 50 * time.Millisecond}}
	pol := PolicyConfig{BaseURL: srvs[0].URL(), Replicas: []string{srvs[1].URL()}, Routing: routing, Model: "m", Version: "v",
		StepTimeout: 10 * time.Second}
	sum, err := Collect(t.Context(), testTasks(6), pol, opts)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return sum, readRecords(t, opts.Out), srvs
}

// TestCollectReplicaKilled: one of two replicas dies mid-batch; every group
// completes on the other, no record is an error, and every step names the
// replica that answered.
func TestCollectReplicaKilled(t *testing.T) {
	sum, recs, srvs := replicaBatch(t, policy.RouteSticky, 20)
	if diff := cmp.Diff(map[Status]int{StatusOK: 24}, statusCounts(recs)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if sum.State != schema.StateComplete || sum.GroupsClosed != 6 {
		t.Errorf("state %q, %d groups closed; want complete, 6", sum.State, sum.GroupsClosed)
	}
	served := map[string]int{}
	for _, r := range recs {
		for _, s := range r.Steps {
			served[s.Model.Replica]++
		}
	}
	if served[srvs[0].URL()] == 0 || served[srvs[1].URL()] == 0 || served[""] != 0 {
		t.Errorf("steps by replica %v: want both replicas named, and no step without one", served)
	}
}

// TestCollectReplicaRouting measures the scripted servers' prefix-cache hit
// rate with group-sticky routing and with round robin: the attempts of a
// group share their prompt's prefix, so sticky routing must hit more.
func TestCollectReplicaRouting(t *testing.T) {
	rate := map[policy.Routing]float64{}
	for _, r := range []policy.Routing{policy.RouteSticky, policy.RouteRoundRobin} {
		sum, _, _ := replicaBatch(t, r, 0)
		rate[r] = sum.PrefixCacheHitRate
	}
	t.Logf("prefix-cache hit rate over 2 replicas: sticky %.3f, round robin %.3f", rate[policy.RouteSticky], rate[policy.RouteRoundRobin])
	if rate[policy.RouteSticky] <= rate[policy.RouteRoundRobin] {
		t.Errorf("sticky routing hit rate %.3f, not above round robin's %.3f", rate[policy.RouteSticky], rate[policy.RouteRoundRobin])
	}
}
