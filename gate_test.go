package rl

import (
	"context"
	"errors"
	"testing"
)

// TestGateDrain: a drain answers once every call let through before the
// pause is back, and not before; calls held at the paused gate are not in
// flight; a gate that serves refuses a drain.
func TestGateDrain(t *testing.T) {
	g := newPolicyGate("v1")
	ctx := t.Context()
	if err := g.drain(ctx); !errors.Is(err, errDrainServing) {
		t.Fatalf("drain while serving: %v; want errDrainServing", err)
	}
	for range 2 {
		if _, _, err := g.enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	g.set("v1", true)
	if st := g.state(); st.InFlight != 2 || !st.Paused {
		t.Fatalf("after pausing: %+v; want 2 in flight, paused", st)
	}
	// A call that comes to the paused gate waits there, not in flight.
	heldCtx, cancelHeld := context.WithCancel(ctx)
	heldDone := make(chan error, 1)
	go func() { _, _, err := g.enter(heldCtx); heldDone <- err }()

	drained := make(chan error, 1)
	go func() { drained <- g.drain(ctx) }()
	g.leave()
	select {
	case err := <-drained:
		t.Fatalf("drain returned (%v) with a call still in flight", err)
	default:
	}
	g.leave()
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if st := g.state(); st.InFlight != 0 {
		t.Errorf("after the drain: %d in flight", st.InFlight)
	}
	cancelHeld()
	if err := <-heldDone; !errors.Is(err, context.Canceled) {
		t.Errorf("held call: %v; want cancelled", err)
	}
	// A drain of a gate with nothing in flight answers at once; one
	// whose ctx ends gives up with its cause.
	if err := g.drain(ctx); err != nil {
		t.Errorf("drain with nothing in flight: %v", err)
	}
	g.set("v1", false)
	if _, _, err := g.enter(ctx); err != nil {
		t.Fatal(err)
	}
	g.set("v2", true)
	cctx, cancel := context.WithCancelCause(ctx)
	cause := errors.New("the trainer gave up")
	cancel(cause)
	if err := g.drain(cctx); !errors.Is(err, cause) {
		t.Errorf("drain with its ctx ended: %v; want the cause", err)
	}
	g.leave()
}
