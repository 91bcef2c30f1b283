package hostdns

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// lookupTimeout bounds one lookup of a Watcher's.
const lookupTimeout = 20 * time.Second

// Watcher resolves a source's name every Source.Every and keeps the hosts
// the last lookup found. A lookup that fails, or finds no record, keeps
// the hosts it had: a DNS blip (or a Service between two rollouts) must
// not take every host away from a batch, and a host that is really gone
// is found down by its pool. Its methods are safe for concurrent use.
type Watcher struct {
	src Source
	log *slog.Logger

	stop context.CancelFunc
	done chan struct{}

	mu    sync.Mutex
	hosts []vm.HostSpec
	// changed is closed (and replaced) when hosts changes.
	changed chan struct{}
}

// Watch resolves the source's name, which must have records, and keeps
// resolving it until Close. ctx bounds the first lookup only.
func Watch(ctx context.Context, src Source, log *slog.Logger) (*Watcher, error) {
	if err := src.Validate(); err != nil {
		return nil, err
	}
	hosts, err := Lookup(ctx, src)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lctx, stop := context.WithCancel(context.Background())
	w := &Watcher{src: src, log: log, stop: stop, done: make(chan struct{}), hosts: hosts, changed: make(chan struct{})}
	go w.run(lctx)
	return w, nil
}

// Hosts returns the hosts the last lookup found and a channel that is
// closed once a lookup finds others.
func (w *Watcher) Hosts() ([]vm.HostSpec, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.hosts), w.changed
}

// Close stops the lookups and waits for the one under way. It is
// idempotent.
func (w *Watcher) Close() {
	w.stop()
	<-w.done
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	tick := time.NewTicker(w.src.every())
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		hosts, err := Lookup(lctx, w.src)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		kept := len(w.hosts)
		w.mu.Unlock()
		if err != nil {
			// Once per failing spell: a name that stays unresolvable
			// would fill the log.
			if !failing {
				w.log.Warn("the hosts' DNS name does not resolve: keeping the hosts it had; tried again every "+w.src.every().String(),
					"name", w.src.Name, "hosts", kept, "err", err)
			}
			failing = true
			continue
		}
		if failing {
			w.log.Info("the hosts' DNS name resolves again", "name", w.src.Name, "hosts", len(hosts))
			failing = false
		}
		w.mu.Lock()
		if !slices.Equal(hosts, w.hosts) {
			w.hosts = hosts
			close(w.changed)
			w.changed = make(chan struct{})
		}
		w.mu.Unlock()
	}
}
