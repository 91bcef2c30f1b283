package osworld

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
)

// ResetGoldenFork started the attempt in a clone of the task's golden
// state (GoldenConfig.Fork): a QEMU of its own that maps the state's guest
// RAM copy-on-write and loads its device state, on the desktop's ports
// while the desktop's VM waits paused.
const ResetGoldenFork = "golden-fork"

// spareClones is how many clones of a template a desktop keeps started
// ahead (QEMU running, waiting for its state), so that a fork needs no
// process start.
const spareClones = 1

// forkState is a desktop's side of the fork path. Reset's calls use it one
// at a time; Close may run at any moment, so what it closes (clone,
// templates) is kept under mu.
type forkState struct {
	mu sync.Mutex
	// clone holds the current attempt; nil when the VM does.
	clone *vm.Clone
	// templates are the golden states' templates of this desktop.
	templates map[*vm.Template]bool
	// closed says Close took clone and templates: anything made later is
	// closed at once.
	closed bool
	// parked says the VM is paused with its ports moved to clone (or
	// free, between two clones).
	parked bool
	// unparked says the VM came back from being parked: it holds what
	// it held before, so the next reset loads its clean snapshot.
	unparked bool
	// spares are the background Prestarts.
	spares sync.WaitGroup
}

// endClone closes the clone that held the last attempt. Unless another
// clone follows (keepParked), the VM takes its ports back and runs again.
func (d *Desktop) endClone(ctx context.Context, keepParked bool) error {
	f := &d.fork
	f.mu.Lock()
	c := f.clone
	f.clone = nil
	f.mu.Unlock()
	if c != nil {
		if err := c.Close(); err != nil {
			d.log.Warn("closing the last attempt's clone", "clone", c.Name(), "err", err)
		}
		d.dropConnections()
	}
	if !f.parked || keepParked {
		return nil
	}
	if err := d.vm.Unpark(ctx); err != nil {
		return fmt.Errorf("take the VM's ports back from its clones: %w", err)
	}
	f.parked, f.unparked = false, true
	return nil
}

// dropConnections forgets kept-alive connections to the guest's ports,
// which now lead to another QEMU.
func (d *Desktop) dropConnections() {
	d.guest.CloseIdleConnections()
	if d.setup != nil && d.setup.Browser != nil {
		d.setup.Browser.CloseIdleConnections()
	}
}

// forkGolden starts the attempt in a clone of g's template on the
// desktop's ports: the VM parks (paused, its ports freed), the clone
// loads the state and takes the ports, and the guest is thawed as after
// a load (clock, entropy).
func (d *Desktop) forkGolden(ctx context.Context, g *goldenState) error {
	if err := d.endClone(ctx, true); err != nil {
		return err
	}
	f := &d.fork
	t0 := time.Now()
	if !f.parked {
		if err := d.vm.Park(ctx); err != nil {
			return err
		}
		f.parked = true
	}
	var c *vm.Clone
	var t1, t2, t3 time.Time
	_, err := d.restore(ctx, func(ctx context.Context) (string, error) {
		t1 = time.Now()
		var err error
		if c, err = g.tmpl.Fork(ctx); err != nil {
			return ResetGoldenFork, err
		}
		if !f.keep(c, nil) {
			return ResetGoldenFork, desktop.ErrClosed
		}
		t2 = time.Now()
		if err := c.Forward(ctx, d.vm.Ports()); err != nil {
			return ResetGoldenFork, fmt.Errorf("forward the desktop's ports to clone %s: %w", c.Name(), err)
		}
		d.dropConnections()
		err = d.waitGuest(ctx)
		t3 = time.Now()
		return ResetGoldenFork, err
	}, newSeed())
	if err != nil {
		return err
	}
	started, spare := c.Started()
	d.log.Debug("forked the golden state", "task", g.task, "clone", c.Name(), "park", t1.Sub(t0), "fork", t2.Sub(t1),
		"clone_restore", c.Restore(), "prestarted", spare, "clone_start", started, "forward_and_answer", t3.Sub(t2), "thaw", time.Since(t3))
	d.spare(g.tmpl)
	return nil
}

// waitGuest waits until the guest answers on the desktop's ports, within
// the boot timeout, each probe bounded like the VM's own; the probe
// measures the guest clock for the thaw.
func (d *Desktop) waitGuest(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, d.cfg.BootTimeout,
		fmt.Errorf("the clone's guest did not answer within %v", d.cfg.BootTimeout))
	defer cancel()
	ports := d.vm.Ports()
	try := d.cfg.VM.ReadyTry
	if try <= 0 {
		try = vm.DefaultReadyTry
	}
	for {
		tctx, tcancel := context.WithTimeout(ctx, try)
		err := d.probe.ready(tctx, ports)
		tcancel()
		if err == nil {
			return nil
		}
		if serr := desktop.Sleep(ctx, 20*time.Millisecond); serr != nil {
			return fmt.Errorf("%w (last probe: %v)", context.Cause(ctx), err)
		}
	}
}

// spare starts a clone of t ahead in the background, for the next fork.
func (d *Desktop) spare(t *vm.Template) {
	f := &d.fork
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	// Under mu, so that no Add races closeFork's Wait.
	f.spares.Add(1)
	f.mu.Unlock()
	go func() {
		defer d.fork.spares.Done()
		// The template's RAM is checked whole here, off the reset's path:
		// a file changed since it was taken makes the next fork fail,
		// which loads the state in place instead.
		t0 := time.Now()
		if err := t.CheckRAM(); err != nil {
			if errors.Is(err, vm.ErrClosed) {
				return
			}
			d.log.Warn("the fork template does not check out; the task's next attempt loads its golden state in place", "template", t.Name(), "err", err)
			return
		}
		d.log.Debug("fork template checked", "template", t.Name(), "took", time.Since(t0))
		if err := t.Prestart(d.closeCtx, spareClones); err != nil && d.closeCtx.Err() == nil && !errors.Is(err, vm.ErrClosed) {
			d.log.Warn("could not start a clone ahead; the next fork starts its own", "template", t.Name(), "err", err)
		}
	}()
}

// takeTemplate captures the running VM, just set up for a task, as the
// template its later attempts fork from. A VM that cannot be forked keeps
// the golden state's in-place load.
func (d *Desktop) takeTemplate(ctx context.Context, g *goldenState) {
	t0 := time.Now()
	t, err := d.vm.Template(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("could not take the task's fork template; its attempts load the golden state in place", "task", g.task, "err", err)
		}
		return
	}
	if !d.fork.keep(nil, t) {
		return
	}
	g.tmpl = t
	tt := t.Timings()
	d.log.Info("took the task's fork template", "task", g.task, "template", t.Name(), "took", time.Since(t0),
		"paused", tt.Paused, "ram_mib", tt.RAMBytes>>20, "state_kib", tt.StateBytes>>10)
	d.spare(t)
}

// keep registers the current clone c or a template t (one of them), for
// Close; after Close it closes it and says false.
func (f *forkState) keep(c *vm.Clone, t *vm.Template) bool {
	f.mu.Lock()
	closed := f.closed
	if !closed {
		if c != nil {
			f.clone = c
		}
		if t != nil {
			if f.templates == nil {
				f.templates = map[*vm.Template]bool{}
			}
			f.templates[t] = true
		}
	}
	f.mu.Unlock()
	if closed {
		if c != nil {
			c.Close()
		}
		if t != nil {
			t.Close()
		}
	}
	return !closed
}

// closeTemplate removes a golden state's template, if any.
func (d *Desktop) closeTemplate(g *goldenState) {
	t := g.tmpl
	if t == nil {
		return
	}
	g.tmpl = nil
	d.fork.mu.Lock()
	delete(d.fork.templates, t)
	d.fork.mu.Unlock()
	if err := t.Close(); err != nil {
		d.log.Warn("removing a fork template", "template", t.Name(), "err", err)
	}
}

// closeFork ends the fork path for Close: the clone, every template (which
// ends their background starts), then waits for those.
func (d *Desktop) closeFork() error {
	f := &d.fork
	f.mu.Lock()
	f.closed = true
	c, ts := f.clone, f.templates
	f.clone, f.templates = nil, nil
	f.mu.Unlock()
	var errs []error
	if c != nil {
		errs = append(errs, c.Close())
	}
	for t := range ts {
		errs = append(errs, t.Close())
	}
	f.spares.Wait()
	return errors.Join(errs...)
}
