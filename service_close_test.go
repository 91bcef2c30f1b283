package rl

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/policy/policytest"
)

// slowClose is a desktop whose Close waits until the test releases it:
// a VM slow to shut down.
type slowClose struct {
	desktop.Desktop
	closing chan struct{} // closed when Close is first called
	once    *sync.Once
	release chan struct{}
}

func (d slowClose) Close() error {
	d.once.Do(func() { close(d.closing) })
	<-d.release
	return d.Desktop.Close()
}

// TestServiceCloseBounded: Close(ctx) returns ctx's error once ctx ends,
// while a desktop is still closing, and the service goes on stopping:
// released, the desktop is closed, Done closes, and Close then returns the
// summary (goleak in TestMain checks nothing is left running).
func TestServiceCloseBounded(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.opts.Desktops, e.opts.Group = 1, 1
	closing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := e.fleet.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		return slowClose{Desktop: d, closing: closing, once: &once, release: release}, nil
	}
	s := e.serve(t)
	released := false
	defer func() {
		// A failed check must not leave the service's goroutines behind.
		if !released {
			close(release)
		}
		_, _ = s.Close(context.Background())
	}()
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s, info.ID)

	// The caller gives up once the desktop is closing.
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		select {
		case <-closing:
		case <-ctx.Done():
		}
		cancel()
	}()
	sum, err := s.Close(ctx)
	if !errors.Is(err, context.Canceled) || sum != nil {
		t.Fatalf("Close with its ctx cancelled while a desktop closes: %v, %v; want context.Canceled and no summary", sum, err)
	}
	select {
	case <-s.Done():
		t.Fatal("the service is done while its desktop is still closing")
	default:
	}

	close(release)
	released = true
	select {
	case <-s.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the service did not stop within 2 minutes of its desktop closing")
	}
	checkClosed(t, e.fleet)
	if sum, err := s.Close(context.Background()); err != nil || sum == nil || sum.Records != 1 {
		t.Fatalf("Close once stopped: %+v, %v; want the summary of 1 record", sum, err)
	}
}
