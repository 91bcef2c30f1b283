package rl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"legato/rl/internal/backoff"
	"legato/rl/policy"
)

// ErrServerDown is returned (wrapped) by Collect when the model server did
// not serve a generation for longer than CollectOptions.ServerDownTimeout.
// Nothing was recorded for the attempts it interrupted; collecting again
// continues the batch.
var ErrServerDown = errors.New("model server down")

// errServerMoved ends the waits on the breaker of a server the batch's
// model calls moved away from (moveMain): the calls go again, to the
// server now in force.
var errServerMoved = errors.New("the model calls moved to other servers")

// outage is the batch's view of the model server's availability: a circuit
// breaker shared by every worker.
//
// It opens on what calls do, not on what a listing says: a call that
// failed the way a broken server fails (policy.IsOutage: unreachable,
// dropped or truncated body, timeout, any 5xx, a 200 that is not a chat
// completion), after its own retries, opens it. While it is open every
// worker pauses at its next model call with its desktop up and its attempt
// in place, and one prober sends the server a one-token generation
// (policy.Client.Ping) with backoff; the first that succeeds closes it,
// and the paused calls are sent again. Time spent paused is the attempts'
// server_down_s, not their model time, and not an error: restarting the
// server between policy versions, or an engine dying behind a live HTTP
// front, costs time, never attempts.
//
// What tells "this one call is bad" from "the server is broken" is the
// prober's generation, the smallest call the server can serve: when it
// fails too, the server is broken and every call waits, however many
// failed; when it succeeds at once, the server serves and the call that
// failed is sent again, at most maxCallsWhileUp times, then is its
// attempt's policy error (a prompt that crashes the engine every time must
// not pause the batch forever). A 4xx names the request and never opens
// the breaker.
type outage struct {
	ping    func(context.Context) error
	limit   time.Duration // how long the server may stay down before the batch stops
	stop    func(error)   // stops the batch
	log     *slog.Logger
	backoff func(n int) time.Duration

	mu      sync.Mutex
	cur     *episode      // nil while the server is taken to be up
	trigger chan struct{} // wakes the prober
	downS   float64       // Σ of the episodes in which a ping failed
	count   int           // such episodes
	// retired is set once the calls moved to other servers (retire);
	// quit then ends the prober.
	retired bool
	quit    context.CancelFunc
}

// episode is one opening of the breaker.
type episode struct {
	start time.Time
	done  chan struct{} // closed when the server answered, or the batch gave up
	// down is set when a ping failed: the server was really away, not one
	// call unlucky.
	down bool
	err  error // set when the batch gave up
}

func newOutage(ping func(context.Context) error, limit time.Duration, stop func(error), log *slog.Logger) *outage {
	return &outage{
		ping: ping, limit: limit, stop: stop, log: log,
		trigger: make(chan struct{}, 1),
		backoff: policy.ProbeBackoff,
	}
}

// pause returns at once while the server is taken to be up; otherwise it
// waits until it answers again, and returns the time it waited.
func (o *outage) pause(ctx context.Context) (time.Duration, error) {
	o.mu.Lock()
	ep, retired := o.cur, o.retired
	o.mu.Unlock()
	if retired {
		return 0, errServerMoved
	}
	if ep == nil {
		return 0, nil
	}
	_, waited, err := o.await(ctx, ep)
	return waited, err
}

// failed reports a call that failed like a broken server and waits until
// the server serves a ping. It returns whether the server was really down
// (a ping failed; false when the first one succeeded: the call alone
// failed), and the time it waited.
func (o *outage) failed(ctx context.Context, cause error) (down bool, waited time.Duration, err error) {
	o.mu.Lock()
	if o.retired {
		o.mu.Unlock()
		return false, 0, errServerMoved
	}
	ep := o.cur
	if ep == nil {
		ep = &episode{start: time.Now(), done: make(chan struct{})}
		o.cur = ep
		// Debug: most openings end at the first ping; the one warning is
		// "model server down", when a ping fails.
		o.log.Debug("model call failed like a broken server; pausing model calls until it serves a one-token generation", "err", cause)
		select {
		case o.trigger <- struct{}{}:
		default:
		}
	}
	o.mu.Unlock()
	return o.await(ctx, ep)
}

func (o *outage) await(ctx context.Context, ep *episode) (bool, time.Duration, error) {
	start := time.Now()
	select {
	case <-ep.done:
	case <-ctx.Done():
		return false, time.Since(start), context.Cause(ctx)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return ep.down, time.Since(start), ep.err
}

// run is the prober: it pings while the breaker is open, until ctx is done
// or the breaker is retired.
func (o *outage) run(ctx context.Context) {
	ctx, quit := context.WithCancel(ctx)
	defer quit()
	o.mu.Lock()
	o.quit = quit
	if o.retired {
		quit()
	}
	o.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			o.end(ctx.Err())
			return
		case <-o.trigger:
		}
		o.probe(ctx)
	}
}

// probe pings the server until it serves, the batch ends, or it has been
// down for longer than the limit.
func (o *outage) probe(ctx context.Context) {
	o.mu.Lock()
	ep := o.cur
	o.mu.Unlock()
	if ep == nil {
		return
	}
	for n := 0; ; n++ {
		// A probe is a generation and may hang as long as the step
		// timeout: it must not carry the wait past the limit.
		pctx, cancel := context.WithDeadline(ctx, ep.start.Add(o.limit))
		err := o.ping(pctx)
		cancel()
		if err == nil {
			o.end(nil)
			return
		}
		if ctx.Err() != nil {
			o.end(ctx.Err())
			return
		}
		o.mu.Lock()
		first := !ep.down
		ep.down = true
		o.mu.Unlock()
		if first {
			o.log.Warn("model server down or not serving; every desktop waits for it (--server-down-timeout bounds the wait)", "err", err, "limit", o.limit)
		}
		if down := time.Since(ep.start); down >= o.limit {
			cause := fmt.Errorf("%w: no one-token generation served for %v, the limit set by --server-down-timeout: %v", ErrServerDown, down.Round(time.Second), err)
			o.stop(cause)
			o.end(cause)
			return
		}
		if backoff.Sleep(ctx, min(o.backoff(n), o.limit-time.Since(ep.start))) != nil {
			o.end(ctx.Err())
			return
		}
	}
}

// retire takes the breaker out of the batch once the batch's model calls
// moved to other servers (moveMain): the calls waiting on it, and any call
// in flight to its server that then fails like a broken server, get
// errServerMoved and go again, to the new servers; its prober stops, so
// its server, left down, is no longer pinged and no longer stops the batch.
func (o *outage) retire() {
	o.mu.Lock()
	o.retired = true
	// A prober not started yet sees retired and quits at once (run).
	waiting, quit := o.cur != nil, o.quit
	o.mu.Unlock()
	if waiting {
		o.log.Warn("the model calls waiting for the server that was down go to the servers the policy moved to")
	}
	o.end(errServerMoved)
	if quit != nil {
		quit()
	}
}

// end closes the current episode: err nil means the server answered.
func (o *outage) end(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ep := o.cur
	if ep == nil {
		return
	}
	o.cur = nil
	ep.err = err
	if ep.down {
		o.downS += time.Since(ep.start).Seconds()
		o.count++
		if err == nil {
			o.log.Warn("model server serves again; resuming", "down_s", time.Since(ep.start).Seconds())
		}
	}
	close(ep.done)
}

// episodes is the number of episodes in which the server was away, over
// every episode that ended.
func (o *outage) episodes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count
}

// downSeconds is the wall time the server was down, over every episode
// that ended.
func (o *outage) downSeconds() float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.downS
}
