package rl

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/policy/policytest"
)

// countedFaults is a scripted server's Options.Faults that breaks it from
// a model call on and counts, server-side, what it was sent.
type countedFaults struct {
	from  int64            // model calls from this one on (from 0) get fault, and so do probes then
	fault policytest.Fault // what a broken server answers
	// held is the number of model calls given the fault that closes
	// heldAll.
	held int64

	calls, faulted, probes atomic.Int64
	once1, once2           sync.Once
	probeFailed            chan struct{} // closed when a probe was given the fault
	heldAll                chan struct{} // closed when held model calls were
}

func newCountedFaults(from int64, fault policytest.Fault, held int64) *countedFaults {
	return &countedFaults{from: from, fault: fault, held: held, probeFailed: make(chan struct{}), heldAll: make(chan struct{})}
}

// healthy counts the model calls of a server that never breaks.
func healthy() *countedFaults { return newCountedFaults(math.MaxInt64, policytest.NoFault, 0) }

func (c *countedFaults) draw(_ int, req policytest.Request) policytest.Fault {
	if isProbe(req) {
		if c.faulted.Load() == 0 {
			return policytest.NoFault
		}
		c.probes.Add(1)
		c.once1.Do(func() { close(c.probeFailed) })
		return c.fault
	}
	if c.calls.Add(1) <= c.from {
		return policytest.NoFault
	}
	if c.faulted.Add(1) == c.held {
		c.once2.Do(func() { close(c.heldAll) })
	}
	return c.fault
}

// served is the number of model calls answered.
func (c *countedFaults) served() int64 { return c.calls.Load() - c.faulted.Load() }

// await waits for ch, failing the test when the service stops first.
func await(t *testing.T, s *Service, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-s.Done():
		t.Fatalf("the service stopped before %s: %v", what, s.Err())
	case <-time.After(2 * time.Minute):
		t.Fatalf("no %s within 2 minutes", what)
	}
}

// moveEnv is a service whose model server breaks at its third model call,
// and a healthy server to move to.
type moveEnv struct {
	*serviceEnv
	old, next *countedFaults
	nextSrv   *policytest.Server
	// replica is the old server's second replica, broken from the start,
	// when there is one.
	replica *countedFaults
	s       *Service
}

// moveLimit is the --server-down-timeout of the tests: an outage of the
// old server longer than it stops the batch unless the move took the
// batch off that server. The tests wait it out after the move. The outage
// test must move within it of the outage's start, which takes a probe and
// a journal line: milliseconds, given ten seconds for a loaded machine.
const moveLimit = 10 * time.Second

func newMoveEnv(t *testing.T, fault policytest.Fault, replicas bool) *moveEnv {
	t.Helper()
	// Two desktops, one group of two attempts of three steps: the first
	// step of each is served, the second meets the broken server.
	m := &moveEnv{old: newCountedFaults(2, fault, 2), next: healthy()}
	m.serviceEnv = newServiceEnv(t, policytest.Options{Script: clicksThenDone(2), Faults: m.old.draw})
	m.opts.ServerDownTimeout = moveLimit
	if replicas {
		m.replica = newCountedFaults(0, fault, 0)
		srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: clicksThenDone(2), Faults: m.replica.draw})
		t.Cleanup(srv.Close)
		m.pol.Replicas = []string{srv.URL()}
	}
	m.nextSrv = policytest.NewServer(policytest.Options{NoLatency: true, Script: clicksThenDone(2), Faults: m.next.draw})
	t.Cleanup(m.nextSrv.Close)
	m.s = m.serve(t)
	t.Cleanup(func() { m.s.Close(context.Background()) })
	return m
}

// finish waits for group id to end and wants it closed, then waits out
// the limit from now and wants the service running and serving groups
// from the new server.
func (m *moveEnv) finish(t *testing.T, id string) {
	t.Helper()
	past := time.After(moveLimit)
	info, err := m.s.Wait(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != GroupClosed {
		t.Fatalf("group %s %s after the move (service stopped: %v, %v); want closed", id, info.State, m.s.Status().Stopped, m.s.Err())
	}
	<-past // the old server has been down for longer than the limit
	if st := m.s.Status(); st.Stopped || m.s.Err() != nil {
		t.Fatalf("past --server-down-timeout after the move: stopped %v, %v; want the service running", st.Stopped, m.s.Err())
	}
	after, _, err := m.s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, m.s, after.ID); info.State != GroupClosed {
		t.Fatalf("a group submitted past the limit: %s, want closed", info.State)
	}
	steps := 0
	for _, r := range readRecords(t, m.opts.Out) {
		if r.Status != StatusOK {
			t.Errorf("%s: %s %+v, want ok", r.RolloutID, r.Status, r.Error)
		}
		steps += len(r.Steps)
	}
	// Every step the old server did not answer before the move, the new
	// one answered: the calls held by the outage, and every one after.
	oldServed := m.old.served()
	if m.replica != nil {
		oldServed += m.replica.served()
	}
	if got, want := m.next.served(), int64(steps)-oldServed; got != want || want != 4+6 {
		t.Errorf("the new server answered %d model calls, want %d (10: 4 of the first group, 6 of the second): %d steps recorded, %d answered by the old server", got, want, steps, oldServed)
	}
}

// TestServiceMoveDuringOutage: moving the policy to other servers while
// its server is down (503) hands the calls waiting for it to the new
// server, and the old server's breaker no longer counts: the service runs
// on past --server-down-timeout, and the old server gets no model call
// after the move.
func TestServiceMoveDuringOutage(t *testing.T) {
	t.Run("one server", func(t *testing.T) { moveDuringOutage(t, false) })
	// Both replicas down: the breaker waits, and the replicas' own prober
	// pings them; the move must end both.
	t.Run("two replicas", func(t *testing.T) { moveDuringOutage(t, true) })
}

func moveDuringOutage(t *testing.T, replicas bool) {
	m := newMoveEnv(t, policytest.FaultUnavailable, replicas)
	g, _, err := m.s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	// The breaker found the server down (a probe failed), and no call is
	// on its way to it: every attempt waits for the breaker.
	await(t, m.s, m.old.probeFailed, "failed probe of the old server")
	for m.s.Status().InFlight > 0 {
		select {
		case <-m.s.Done():
			t.Fatalf("the service stopped: %v", m.s.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	olds := []*countedFaults{m.old}
	if m.replica != nil {
		olds = append(olds, m.replica)
	}
	var calls, probes []int64
	for _, o := range olds {
		calls, probes = append(calls, o.calls.Load()), append(probes, o.probes.Load())
	}
	if _, err := m.s.SetPolicy("", false, m.nextSrv.URL()); err != nil {
		t.Fatal(err)
	}
	m.finish(t, g.ID)
	var probed int64
	for i, o := range olds {
		if got := o.calls.Load() - calls[i]; got != 0 {
			t.Errorf("old server %d got %d model calls after the move, want none", i, got)
		}
		probed += o.probes.Load() - probes[i]
	}
	// A probe may have been on its way at the move, from the breaker and
	// from the replicas' prober; none follows.
	if probers := int64(len(olds)); probed > probers {
		t.Errorf("the old servers were probed %d times after the move, want at most %d: a prober still waits for them", probed, probers)
	}
	var downS float64
	for _, r := range readRecords(t, m.opts.Out) {
		downS += r.Timing.ServerDownS
	}
	if downS == 0 {
		t.Error("no record waited for the server: the calls were not held by the outage")
	}
}

// TestServiceMoveCallsInFlight: calls in flight on the old server when
// the policy moves finish there; when that server then dies (it hung
// them, then closed), they go again to the new server, and the old
// server staying away does not stop the service.
func TestServiceMoveCallsInFlight(t *testing.T) {
	m := newMoveEnv(t, policytest.FaultHang, false)
	g, _, err := m.s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	await(t, m.s, m.old.heldAll, "two calls held by the old server")
	if _, err := m.s.SetPolicy("", false, m.nextSrv.URL()); err != nil {
		t.Fatal(err)
	}
	m.srv.Close() // the held calls fail; the old server refuses connections
	m.finish(t, g.ID)
	sum, err := m.s.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The calls that failed went to the new server at once: no breaker
	// waited for the old one.
	if sum.Outages != 0 || sum.ServerDownS != 0 {
		t.Errorf("summary: %d outages, %v s down; want none", sum.Outages, sum.ServerDownS)
	}
}
