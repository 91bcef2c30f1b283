package rl

import (
	"context"
	"errors"
	"sync"
	"time"
)

// policyGate holds the policy version in force and whether new model calls
// may start. A trainer pauses it while it swaps weights on its servers: an
// attempt that reaches its next model call waits there, its desktop up and
// its rollout clock stopped, and the calls sent after the trainer resumes
// carry the version it then names. Collect's gate is never paused and its
// version is the batch's.
type policyGate struct {
	mu      sync.Mutex
	version string
	since   time.Time
	// resumed is non-nil while paused, and closed when serving resumes.
	resumed chan struct{}
	held    int // calls waiting at the gate now
	// inFlight counts the calls let through and not yet back (leave);
	// idle, when a drain waits, is closed once it is 0.
	inFlight int
	idle     chan struct{}
}

func newPolicyGate(version string) *policyGate {
	return &policyGate{version: version, since: time.Now()}
}

// enter waits while the gate is paused and returns the version in force
// when it let the call through, and how long it waited. A call let through
// is in flight until it calls leave, once its answer (or failure) is back.
func (g *policyGate) enter(ctx context.Context) (version string, waited time.Duration, err error) {
	start := time.Now()
	for {
		g.mu.Lock()
		resumed, v := g.resumed, g.version
		if resumed == nil {
			g.inFlight++
			g.mu.Unlock()
			return v, time.Since(start), nil
		}
		g.held++
		g.mu.Unlock()
		select {
		case <-resumed:
		case <-ctx.Done():
		}
		g.mu.Lock()
		g.held--
		g.mu.Unlock()
		if ctx.Err() != nil {
			return "", time.Since(start), context.Cause(ctx)
		}
	}
}

// leave ends a call that enter let through.
func (g *policyGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	if g.inFlight == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// errDrainServing is the error of a drain asked of a gate that serves: its
// calls would never stop.
var errDrainServing = errors.New("drain needs the policy paused: new model calls would keep starting")

// drain waits until no call is in flight: a trainer that paused the gate
// then knows that every call sent under the old weights has returned, so
// it may swap them. It refuses a gate that serves.
func (g *policyGate) drain(ctx context.Context) error {
	g.mu.Lock()
	if g.resumed == nil {
		g.mu.Unlock()
		return errDrainServing
	}
	if g.inFlight == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// PolicyState is the state of a service's policy gate.
type PolicyState struct {
	// Version is the policy version stamped on the model calls sent from
	// now on.
	Version string `json:"version"`
	// Paused holds new model calls until serving resumes.
	Paused bool `json:"paused"`
	// Since is when the state last changed.
	Since time.Time `json:"since"`
	// Held counts the model calls waiting for serving to resume.
	Held int `json:"held"`
	// InFlight counts the model calls sent and not yet answered.
	InFlight int `json:"in_flight"`
	// Servers are the model servers the calls go to (a service's base
	// URLs in force), as the service knows them.
	Servers []string `json:"servers,omitempty"`
}

// set changes the version and the state.
func (g *policyGate) set(version string, paused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if version != g.version || paused != (g.resumed != nil) {
		g.version = version
		g.since = time.Now()
	}
	switch {
	case paused && g.resumed == nil:
		g.resumed = make(chan struct{})
	case !paused && g.resumed != nil:
		close(g.resumed)
		g.resumed = nil
	}
}

func (g *policyGate) state() PolicyState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return PolicyState{Version: g.version, Paused: g.resumed != nil, Since: g.since, Held: g.held, InFlight: g.inFlight}
}
