package rl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sync"

	"legato/rl/policy"
)

// GroupPolicy is a group's own model server, for trainers that hand every
// rollout its own endpoint (a gateway that records tokens, a server per
// worker): its fields replace the service's; the key comes apart
// (GroupRequest.APIKey), never stored or logged.
type GroupPolicy struct {
	BaseURL     string   `json:"base_url,omitempty"`
	Model       string   `json:"model,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
}

// modelServer is what an attempt's model calls go through: the client, the
// breaker that rides out its outages, and the policy its records name.
type modelServer struct {
	client *policy.Replicas
	outage *outage
	pol    PolicyConfig
	// own is set for a group's own server: a refusal (401, 403, 404) is
	// then that group's failure, not the batch's.
	own bool
}

// server returns the model server of a's group.
func (b *batch) server(a *attempt) *modelServer {
	if a.g.server != nil {
		return a.g.server
	}
	return b.main.Load()
}

// mainServers returns every model server the batch had as its own.
func (b *batch) mainServers() []*modelServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.mains)
}

// newMain returns the batch's model server on client, with its outage
// breaker, which stops the batch only while the server is the batch's.
func (b *batch) newMain(client *policy.Replicas, cfg PolicyConfig) *modelServer {
	m := &modelServer{client: client, pol: cfg}
	m.outage = newOutage(client.Ping, b.opts.ServerDownTimeout, func(err error) { b.failFrom(m, err) }, b.log)
	return m
}

// moveMain makes cfg's servers the batch's model server: calls sent from
// now on go there, and so do the calls waiting for the old server to come
// back from an outage; calls in flight finish where they went, or, when
// they fail like a broken server, go again to the new servers. The old
// server's breaker stops probing, and its outage no longer stops the batch
// (--server-down-timeout is the new server's).
func (b *batch) moveMain(cfg PolicyConfig) error {
	if b.ready != nil {
		<-b.ready
	}
	client, err := policy.NewReplicas(cfg)
	if err != nil {
		return err
	}
	m := b.newMain(client, cfg)
	b.mu.Lock()
	if b.runCtx.Err() != nil || b.fatal != nil {
		b.mu.Unlock()
		client.Close()
		return errBatchStopping
	}
	old := b.main.Load()
	b.mains = append(b.mains, m)
	b.probes.Go(func() { m.outage.run(b.runCtx) })
	b.main.Store(m)
	b.mu.Unlock()
	old.outage.retire()
	// Its replicas' prober too; calls in flight on it still finish (run
	// closes it again at the end).
	old.client.Close()
	return nil
}

// movedFrom reports whether a's calls no longer go to srv: the batch moved
// to other servers (moveMain). A call that waited on srv's breaker then
// goes again, to the server now in force, whatever the wait ended with
// (errServerMoved, or the old breaker giving up in the moment of the move).
func (b *batch) movedFrom(a *attempt, srv *modelServer) bool { return b.server(a) != srv }

// newGroupServers returns the per-group servers of b's groups, their
// probers running until ctx ends; the servers' policy is b's.
func newGroupServers(ctx context.Context, b *batch) *groupServers {
	return &groupServers{ctx: ctx, base: b.pol, b: b, byID: map[string]*modelServer{}}
}

// groupServers keeps a service's per-group model servers, one per distinct
// configuration, for the service's life.
type groupServers struct {
	ctx  context.Context // the service's run: it ends the probers
	base PolicyConfig
	b    *batch

	mu   sync.Mutex
	byID map[string]*modelServer
	wg   sync.WaitGroup
}

// get returns the server for p with key, creating it on first use.
func (gs *groupServers) get(p GroupPolicy, key string) (*modelServer, error) {
	cfg := gs.base
	cfg.Replicas = nil // the override names one server
	if p.BaseURL != "" {
		cfg.BaseURL = p.BaseURL
	}
	if p.Model != "" {
		cfg.Model = p.Model
	}
	if p.Temperature != nil {
		cfg.Temperature = p.Temperature
	}
	if p.TopP != nil {
		cfg.TopP = p.TopP
	}
	if p.MaxTokens != 0 {
		cfg.MaxTokens = p.MaxTokens
	}
	cfg.APIKey = key
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(p)
	sum := sha256.Sum256(append(append(raw, 0), key...))
	id := hex.EncodeToString(sum[:])
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if s := gs.byID[id]; s != nil {
		return s, nil
	}
	if gs.ctx.Err() != nil {
		return nil, errBatchStopping
	}
	client, err := policy.NewReplicas(cfg)
	if err != nil {
		return nil, err
	}
	// Its outages cost its attempts time; past the limit they fail as
	// policy errors (the waiting calls get the breaker's error), and the
	// service goes on.
	s := &modelServer{client: client, pol: cfg, own: true,
		outage: newOutage(client.Ping, gs.b.opts.ServerDownTimeout, func(error) {}, gs.b.log)}
	gs.wg.Go(func() { s.outage.run(gs.ctx) })
	gs.byID[id] = s
	return s, nil
}

// close waits for the probers (the service's ctx ended) and closes the
// clients.
func (gs *groupServers) close() {
	gs.wg.Wait()
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, s := range gs.byID {
		s.client.Close()
	}
}

// gaveUp is the error of a call whose wait for the server ended with err:
// the attempt's ctx ended (err as it is), or the breaker gave up on the
// server. The batch's breaker then stopped the batch; a group's own
// server staying away is that group's policy failure, and the service
// goes on.
func (s *modelServer) gaveUp(ctx context.Context, err error) error {
	if ctx.Err() != nil || !s.own {
		return err
	}
	return &policyFailure{err: err, own: true}
}
