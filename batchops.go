package rl

import (
	"context"
	"errors"

	"legato/rl/schema"
)

// What a front door that steers a running batch (a service) may ask of it:
// groups added and dropped, the policy gate moved, a snapshot of where the
// batch is. The door holds the batch and touches none of its fields, so
// the engine's state is changed in the engine's files only.

// errBatchStopping refuses what a batch that is stopping can no longer
// take: a group, another model server. A front door says it in its own
// words.
var errBatchStopping = errors.New("it is stopping")

// options returns the batch's options, with their defaults.
func (b *batch) options() CollectOptions { return b.opts }

// startOn makes the batch start on the model servers at urls instead of
// its policy's (urls[0] the base, the rest replicas), before it runs: its
// client is made after a door's restore. It reports whether the base
// differs from the policy's.
func (b *batch) startOn(urls []string) (moved bool) {
	moved = urls[0] != b.pol.BaseURL
	b.pol.BaseURL, b.pol.Replicas = urls[0], urls[1:]
	return moved
}

// restoreGroup adds a group of an earlier run, before the batch runs.
func (b *batch) restoreGroup(g *group) { b.sched.addLocked0(g) }

// restoreDrop ends, before the batch runs, a group of an earlier run that
// its caller cancelled (or that cannot run on).
func (b *batch) restoreDrop(id string) {
	if g := b.sched.byID[id]; g != nil {
		g.closed, g.dropped = true, true
	}
}

// restoredDropped reports whether restoreDrop ended group id.
func (b *batch) restoredDropped(id string) bool {
	g := b.sched.byID[id]
	return g != nil && g.dropped
}

// runAndClose runs the batch to its end (run), then closes its client and
// its run directory.
func (b *batch) runAndClose(ctx context.Context) (*Summary, error) {
	defer b.client.Close()
	defer b.store.Close()
	return b.run(ctx)
}

// submit adds a group to the running batch and queues its attempts;
// errBatchStopping once the batch stops.
func (b *batch) submit(g *group) error {
	if !b.sched.add(g) {
		return errBatchStopping
	}
	return nil
}

// cancelGroup ends group id (scheduler.drop).
func (b *batch) cancelGroup(id string) { b.sched.drop(id) }

// groupStarted reports whether an attempt of group id has left the queue.
func (b *batch) groupStarted(id string) bool { return b.sched.started(id) }

// groupFinals returns the offsets in rollouts.jsonl of the final records
// of group id's attempts, in attempt order.
func (b *batch) groupFinals(id string) []int64 { return b.sched.finals(id) }

// quarantined returns the quarantine's entry for t, if it holds t.
func (b *batch) quarantined(t Task) (schema.QuarantinedTask, bool) {
	return b.quar.holds(t.ID, TaskSHA(t))
}

// quarantineFiles names the batch's quarantine files, for a refusal to
// say where an entry is removed.
func (b *batch) quarantineFiles() string {
	place := b.quar.runFile
	if b.quar.shared != "" {
		place += " or " + b.quar.shared
	}
	return place
}

// policyVersion is the policy version in force.
func (b *batch) policyVersion() string { return b.gate.state().Version }

// gateState returns the policy gate's state, without the servers.
func (b *batch) gateState() PolicyState { return b.gate.state() }

// policyState returns the policy gate's state and the servers the
// batch's calls go to.
func (b *batch) policyState() PolicyState {
	st := b.gateState()
	if m := b.main.Load(); m != nil {
		st.Servers = append([]string{m.pol.BaseURL}, m.pol.Replicas...)
	}
	return st
}

// setPolicy changes the version stamped on the calls sent from now on and
// whether they are held (policyGate.set).
func (b *batch) setPolicy(version string, paused bool) { b.gate.set(version, paused) }

// drainCalls waits until no model call is in flight (policyGate.drain).
func (b *batch) drainCalls(ctx context.Context) error { return b.gate.drain(ctx) }

// policyOn returns the batch's policy on the model servers at urls
// (urls[0] the base, the rest replicas), checked, for moveMain.
func (b *batch) policyOn(urls []string) (PolicyConfig, error) {
	cfg := b.pol
	cfg.BaseURL, cfg.Replicas = urls[0], urls[1:]
	return cfg, cfg.Validate()
}

// phaseSeconds sums the seconds the batch's tries spent per timing phase.
func (b *batch) phaseSeconds() map[string]float64 {
	b.sched.mu.Lock()
	defer b.sched.mu.Unlock()
	return b.sched.summary.PhaseSeconds()
}
