package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"legato/rl/schema"
)

// Routing says how Replicas spreads calls over servers.
type Routing int

const (
	// RouteSticky sends every call of a key (a group of attempts) to one
	// replica while it is up, the one with the fewest calls in flight (then
	// the fewest keys) when the key first came: the attempts of a group share their prompt's
	// prefix (system prompt, task, first screenshot), which that replica's
	// prefix cache then holds.
	RouteSticky Routing = iota
	// RouteRoundRobin sends each call to the next replica that is up,
	// whatever its key: for comparison.
	RouteRoundRobin
)

// ErrNoReplica is wrapped by Replicas.Complete's error when every replica
// is down.
var ErrNoReplica = errors.New("no model-server replica answers")

// Replicas calls a model served by several servers with the same weights
// (data-parallel replicas): BaseURL and Config.Replicas. Each replica is a
// Client of its own, with its own MaxInflight. A replica whose call fails
// like a broken server (IsOutage: 5xx, dropped or unparsable bodies,
// timeouts) is taken out, the call goes to another at once, and a
// background prober brings it back when it serves a one-token generation
// (Client.Ping).
// With one URL it is a Client. It is safe for concurrent use; Close it.
type Replicas struct {
	reps    []*replica
	routing Routing
	log     *slog.Logger

	mu     sync.Mutex
	sticky map[string]*replica
	next   int // round robin

	wake   chan struct{}
	stop   context.CancelFunc
	probes sync.WaitGroup
}

type replica struct {
	c   *Client
	url string // without credentials
	// down, its backoff and keys are guarded by Replicas.mu.
	down  bool
	tries int
	keys  int // keys stuck to it
	// pinged is when a ping of it last failed, by the prober or by Ping
	// (the batch's outage breaker, when every replica is down): the
	// prober lets a replica rest its backoff after either.
	pinged time.Time
}

// backoff is the rest between two pings of a replica that is down.
func (rep *replica) backoff() time.Duration { return ProbeBackoff(rep.tries) }

// NewReplicas returns the replicas of cfg: one Client per URL of BaseURL and
// Replicas, each configured as cfg says.
func NewReplicas(cfg Config) (*Replicas, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	urls := append([]string{cfg.BaseURL}, cfg.Replicas...)
	r := &Replicas{routing: cfg.Routing, log: cfg.Logger, sticky: make(map[string]*replica), wake: make(chan struct{}, 1)}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	for _, u := range urls {
		c := cfg
		c.BaseURL, c.Replicas = u, nil
		client, err := New(c)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.reps = append(r.reps, &replica{c: client, url: redactURL(u)})
	}
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	if len(r.reps) > 1 {
		r.probes.Go(func() { r.probe(ctx) })
	}
	return r, nil
}

// Close stops the prober and closes every replica's client.
func (r *Replicas) Close() {
	if r.stop != nil {
		r.stop()
	}
	r.probes.Wait()
	for _, rep := range r.reps {
		rep.c.Close()
	}
}

// Complete makes a call for key (the group of attempts it belongs to) on a
// replica that is up, moving to another when one fails like a broken
// server. The time and the HTTP requests spent on replicas that failed
// count in the result's Model.Seconds, QueueS and Attempts; Model.Replica
// names the replica that answered when there are several. When no replica
// answers the error is the last one's and wraps ErrNoReplica (IsOutage
// holds: the batch waits for one to serve a ping), and the result, when a
// call was issued, carries what the failed ones cost.
func (r *Replicas) Complete(ctx context.Context, key string, msgs []schema.Message) (*Result, error) {
	var spent, queued float64
	var sent int // HTTP requests made on replicas that failed
	var tried []*replica
	var last error = errors.New("every replica is down")
	var lastRes *Result
	for {
		rep := r.pick(key, tried)
		if rep == nil {
			return lastRes, &noReplica{last: last}
		}
		res, err := rep.c.Complete(ctx, msgs)
		if res != nil {
			res.Model.Seconds += spent
			res.Model.QueueS += queued
			res.Model.Attempts += sent
			if len(r.reps) > 1 {
				res.Model.Replica = rep.url
			}
		}
		if err == nil || ctx.Err() != nil || !IsOutage(err) || len(r.reps) == 1 {
			return res, err
		}
		r.markDown(rep, err)
		tried, last = append(tried, rep), err
		if res != nil {
			spent, queued, sent = res.Model.Seconds, res.Model.QueueS, res.Model.Attempts
			lastRes = res
		}
	}
}

// noReplica is the error of a call no replica answered: the last replica's
// error, which is an outage, also wrapping ErrNoReplica.
type noReplica struct{ last error }

func (e *noReplica) Error() string   { return fmt.Sprintf("%v: %v", ErrNoReplica, e.last) }
func (e *noReplica) Unwrap() []error { return []error{ErrNoReplica, e.last} }

// pick chooses the replica for key's next call, skipping those in tried.
func (r *Replicas) pick(key string, tried []*replica) *replica {
	r.mu.Lock()
	defer r.mu.Unlock()
	usable := func(rep *replica) bool {
		if rep.down {
			return false
		}
		for _, t := range tried {
			if t == rep {
				return false
			}
		}
		return true
	}
	if r.routing == RouteRoundRobin {
		for range r.reps {
			rep := r.reps[r.next%len(r.reps)]
			r.next++
			if usable(rep) {
				return rep
			}
		}
		return nil
	}
	if rep := r.sticky[key]; rep != nil && usable(rep) {
		return rep
	}
	var best *replica
	for _, rep := range r.reps {
		if !usable(rep) {
			continue
		}
		if best == nil || rep.c.InFlight() < best.c.InFlight() || (rep.c.InFlight() == best.c.InFlight() && rep.keys < best.keys) {
			best = rep
		}
	}
	if best != nil {
		if old := r.sticky[key]; old != nil {
			old.keys--
		}
		r.sticky[key] = best
		best.keys++
	}
	return best
}

func (r *Replicas) markDown(rep *replica, err error) {
	r.mu.Lock()
	was := rep.down
	rep.down = true
	r.mu.Unlock()
	if !was {
		r.log.Warn("model-server replica down; its groups move to the others", "replica", rep.url, "err", err)
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// probe pings the replicas that are down, with backoff, and brings back
// those that answer, until ctx is done.
func (r *Replicas) probe(ctx context.Context) {
	for {
		r.mu.Lock()
		var down []*replica
		for _, rep := range r.reps {
			if rep.down {
				down = append(down, rep)
			}
		}
		r.mu.Unlock()
		wait := time.Duration(1<<62 - 1)
		for _, rep := range down {
			r.mu.Lock()
			rest := rep.backoff() - time.Since(rep.pinged)
			r.mu.Unlock()
			if rest > 0 {
				wait = min(wait, rest) // pinged lately, by Ping
				continue
			}
			if rep.c.Ping(ctx) == nil {
				r.up(rep)
				continue
			}
			r.mu.Lock()
			rep.tries++
			rep.pinged = time.Now()
			wait = min(wait, rep.backoff())
			r.mu.Unlock()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func (r *Replicas) up(rep *replica) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rep.down {
		rep.down, rep.tries = false, 0
		r.log.Warn("model-server replica answers again; it takes groups again", "replica", rep.url)
	}
}

// Ping reports whether a replica serves: it pings (Client.Ping, a
// one-token generation) those that are down (all of them, when every one
// is) and brings back the first that serves.
func (r *Replicas) Ping(ctx context.Context) error {
	var errs []error
	for _, rep := range r.reps {
		r.mu.Lock()
		down := rep.down || len(r.reps) == 1
		r.mu.Unlock()
		if !down {
			return nil
		}
		err := rep.c.Ping(ctx)
		if err == nil {
			r.up(rep)
			return nil
		}
		r.mu.Lock()
		rep.pinged = time.Now()
		r.mu.Unlock()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// InFlight is the number of calls in flight on every replica.
func (r *Replicas) InFlight() int {
	n := 0
	for _, rep := range r.reps {
		n += rep.c.InFlight()
	}
	return n
}
