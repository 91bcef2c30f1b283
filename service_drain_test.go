package rl

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/policy/policytest"
)

// TestServiceDrain: a drain asked while a model call is in flight answers
// once that call is back, and the call's step carries the version it was
// sent under; the calls that reach the paused gate meanwhile wait there
// and go under the version served next.
func TestServiceDrain(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	// The model server behind a proxy that holds the first call until
	// the test lets it go.
	target, err := url.Parse(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	var calls atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(arrived)
			<-release
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	defer let() // a failing test must not leave the call held: Close waits for it
	e.pol.BaseURL = front.URL + target.Path
	e.opts.Desktops, e.opts.Group = 1, 1
	s := e.serve(t)
	defer s.Close(context.Background())

	if err := s.Drain(t.Context()); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("drain while serving: %v; want ErrBadRequest", err)
	}
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	<-arrived
	if st := s.Policy(); st.InFlight != 1 {
		t.Fatalf("one call held by the server: in flight %d", st.InFlight)
	}
	if _, err := s.SetPolicy("v1", true); err != nil {
		t.Fatal(err)
	}
	// The server holds the call until the test lets it go: a drain
	// bounded meanwhile must give up, not answer.
	bounded, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	err = s.Drain(bounded)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain with the call held: %v; want it still waiting when its ctx ended", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(t.Context()) }()
	select {
	case err := <-drained:
		t.Fatalf("drain answered (%v) while the call was in flight", err)
	default:
	}
	let()
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	// Drained: the attempt's next call waits at the gate, under no
	// version yet.
	if st := s.Policy(); st.InFlight != 0 {
		t.Fatalf("after the drain: %d calls in flight", st.InFlight)
	}
	if _, err := s.SetPolicy("v2", false); err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s, info.ID); info.State != GroupClosed {
		t.Fatalf("group %s (service: %v)", info.State, s.Err())
	}
	recs := readRecords(t, e.opts.Out)
	if len(recs) != 1 || len(recs[0].Steps) != 2 {
		t.Fatalf("%d records; want one of two steps", len(recs))
	}
	if v0, v1 := recs[0].Steps[0].PolicyVersion, recs[0].Steps[1].PolicyVersion; v0 != "v1" || v1 != "v2" {
		t.Errorf("steps' versions %q, %q; want v1 (sent before the pause), v2 (after)", v0, v1)
	}
}
