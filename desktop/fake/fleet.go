package fake

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"legato/rl/desktop"
	"legato/rl/internal/backoff"
)

var _ desktop.Factory = (&Fleet{}).New

// Fleet creates fake desktops for a scheduler, one per worker slot and a new
// one each time the scheduler replaces a desktop that failed, and remembers
// them all so that a test can check what was done to each (was every
// desktop closed?).
//
// Each desktop gets a seed derived from Config.Seed, its slot and how many
// desktops the slot had before (its generation), and a name: "fake-3" for
// slot 3, "fake-3.1" for its first replacement (with Config.Name for
// "fake").
type Fleet struct {
	cfg Config
	err error // from cfg.Validate
	// screens are shared by the fleet's desktops: one per CPU.
	screens *screens

	mu       sync.Mutex
	gens     map[int]int // per slot: desktops created so far
	created  int
	desktops []*Desktop
}

// NewFleet returns a fleet of desktops configured by cfg. If cfg is invalid,
// New returns the error from cfg.Validate.
func NewFleet(cfg Config) *Fleet {
	cfg.Rewards = maps.Clone(cfg.Rewards)
	cfg.Faults = slices.Clone(cfg.Faults)
	if cfg.Name == "" {
		cfg.Name = "fake"
	}
	w, h := cfg.size()
	return &Fleet{cfg: cfg, err: cfg.Validate(), gens: make(map[int]int), screens: newScreens(w, h, runtime.GOMAXPROCS(0))}
}

// Factory returns the New method of a new Fleet: a desktop.Factory that gives
// each slot a desktop of its own, with a distinct derived seed.
func Factory(cfg Config) desktop.Factory { return NewFleet(cfg).New }

// New creates the desktop of a slot, after Latency.Create, and returns
// AsConfigured of it. Faults of PhaseCreate apply, counted per fleet: the
// n-th call of New is call n.
func (f *Fleet) New(ctx context.Context, slot int) (desktop.Desktop, error) {
	if f.err != nil {
		return nil, fmt.Errorf("fake fleet: invalid config: %w", f.err)
	}
	if slot < 0 {
		return nil, fmt.Errorf("fake fleet: slot %d must be ≥ 0", slot)
	}
	f.mu.Lock()
	gen := f.gens[slot]
	f.gens[slot]++
	f.created++
	n := f.created
	f.mu.Unlock()

	name := f.cfg.Name + "-" + strconv.Itoa(slot)
	if gen > 0 {
		name += "." + strconv.Itoa(gen)
	}
	fail := func(err error) error {
		return &desktop.Error{Op: string(PhaseCreate), Desktop: name, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, fail(err)
	}
	if flt, ok := matchFault(f.cfg.Faults, drawKey{seed: f.cfg.Seed, n: n}, name, PhaseCreate, n, ""); ok {
		switch flt.Kind {
		case FaultHang:
			<-ctx.Done()
			return nil, fail(ctx.Err())
		case FaultUnsupported:
			return nil, fail(fmt.Errorf("%w (injected on call %d)", desktop.ErrUnsupported, n))
		}
		return nil, fail(fmt.Errorf("%w on call %d", ErrInjected, n))
	}
	seed := deriveSeed(f.cfg.Seed, slot, gen)
	if l := f.cfg.Latency.Create; l != (Latency{}) {
		if err := backoff.Sleep(ctx, l.Sample(draw(seed, "latency", "create", 0))); err != nil {
			return nil, fail(err)
		}
	}

	d := newDesktop(f.cfg, name, seed, f.screens)
	f.mu.Lock()
	f.desktops = append(f.desktops, d)
	f.mu.Unlock()
	return d.AsConfigured(), nil
}

// Desktops returns every desktop the fleet created, in order of creation.
func (f *Fleet) Desktops() []*Desktop {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.desktops)
}

// Stats returns the sum of the Stats of every desktop the fleet created.
func (f *Fleet) Stats() Stats {
	var s Stats
	for _, d := range f.Desktops() {
		s = s.add(d.Stats())
	}
	return s
}
