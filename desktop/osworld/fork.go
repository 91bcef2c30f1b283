package osworld

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
	"legato/rl/internal/backoff"
)

// maxSpareClones bounds the clones of one template started ahead.
const maxSpareClones = 4

// forkTemplates are the fork templates of a pool's desktops, by host and
// golden key (templateKey): one desktop takes a task's template, and every
// desktop of the pool on that host forks its attempts of the task from it,
// so a group spread over desktops starts from one state and sets the task
// up once.
// The pool keeps Golden.Max of them, dropping the least recently used one
// that no desktop's current attempt runs in.
type forkTemplates struct {
	max int
	log *slog.Logger
	// spread says the pool's desktops run on more than one host: where a
	// task's template is then says where its attempts start fastest.
	spread bool

	mu     sync.Mutex
	byKey  map[string]*forkTemplate
	uses   int
	closed bool
}

// forkSource is a template the pool forks from: one on this machine
// (hostagent.LocalTemplate), or one a host agent took on a remote host
// (remoteTemplate). fork.go does not care which; the agent serves its
// templates through the same interface.
type forkSource = hostagent.Template

// forkClone is a clone of a forkSource (vm.Clone, hostagent.RemoteClone).
type forkClone = hostagent.Clone

// remoteTemplate is a template a host agent took on its host.
type remoteTemplate struct{ *hostagent.RemoteTemplate }

func (t remoteTemplate) Fork(ctx context.Context) (forkClone, error) {
	c, err := t.RemoteTemplate.Fork(ctx)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// templateKey is the registry's key of a golden state's template: the
// golden key on one host. Templates are per host (a clone maps its
// template's RAM file, which stays on the host it was taken on), so
// desktops on another host never fork it.
func templateKey(host, key string) string { return host + "\x00" + key }

// forkTemplate is one task's template, with what a fork reports.
type forkTemplate struct {
	t     forkSource
	key   string // templateKey
	host  string // the host it is on (Desktop.host)
	task  string
	by    string // the desktop that took it
	built time.Time
	setup time.Duration // the setup each fork saves
	// execDir is the action executor that ran when it was taken.
	execDir string
	// Guarded by the registry's mu:
	failed  int  // forks in a row whose clone never served (see failedFork)
	inUse   int  // desktops whose current attempt runs in a clone of it
	used    int  // the registry's use count when last used
	forks   int  // clones started from it
	checked bool // its RAM file's content was checked (CheckRAM)
	dropped bool // unlisted after a fault; closed once no attempt runs in it
}

func newForkTemplates(max int, log *slog.Logger) *forkTemplates {
	return &forkTemplates{max: max, log: log, byKey: map[string]*forkTemplate{}}
}

// has reports whether there is a template for key.
func (s *forkTemplates) has(key string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key] != nil
}

// affinity says where the attempts of a task start fastest for a desktop
// on host: in a clone of the task's template, which only desktops on the
// template's host fork.
func (s *forkTemplates) affinity(task, host string) desktop.Affinity {
	if s == nil || !s.spread {
		return desktop.AnyDesktop
	}
	s.mu.Lock()
	var holders []string
	for _, ft := range s.byKey {
		if ft.task == task {
			holders = append(holders, ft.host)
		}
	}
	s.mu.Unlock()
	return affinityOf(holders, host)
}

// affinityOf is a desktop's affinity to a task whose templates are on the
// holders' hosts, for a desktop on host.
func affinityOf(holders []string, host string) desktop.Affinity {
	switch {
	case slices.Contains(holders, host):
		return desktop.HereFaster
	case len(holders) > 0:
		return desktop.ElsewhereFaster
	}
	return desktop.AnyDesktop
}

// Affinity says whether the desktop starts attempts at the task faster
// than desktops on other hosts: its host holds the task's fork template
// (HereFaster), or only other hosts do (ElsewhereFaster). With the pool on
// one host, or without forks, no desktop does (AnyDesktop).
func (d *Desktop) Affinity(taskID string) desktop.Affinity {
	return d.golden.forks.affinity(taskID, d.host)
}

// add keeps ft unless a template of its key is there already (two
// desktops took one at once): then ft is closed. It evicts beyond max.
func (s *forkTemplates) add(ft *forkTemplate) {
	s.mu.Lock()
	dup := s.closed || s.byKey[ft.key] != nil
	var evicted []*forkTemplate
	if !dup {
		s.uses++
		ft.used = s.uses
		s.byKey[ft.key] = ft
		evicted = s.evictLocked(ft.key)
	}
	s.mu.Unlock()
	if dup {
		ft.t.Close()
	}
	s.closeAll(evicted, "least recently used beyond Golden.Max")
}

// evictLocked removes the least recently used templates beyond max that
// no attempt runs in, never keep (just taken), and returns them for
// closing.
func (s *forkTemplates) evictLocked(keep string) []*forkTemplate {
	var idle []*forkTemplate
	for _, ft := range s.byKey {
		if ft.inUse == 0 && ft.key != keep {
			idle = append(idle, ft)
		}
	}
	slices.SortFunc(idle, func(a, b *forkTemplate) int { return a.used - b.used })
	var out []*forkTemplate
	for n := len(s.byKey) - s.max; n > 0 && len(idle) > 0; n-- {
		out = append(out, idle[0])
		delete(s.byKey, idle[0].key)
		idle = idle[1:]
	}
	return out
}

func (s *forkTemplates) closeAll(fts []*forkTemplate, why string) {
	for _, ft := range fts {
		if err := ft.t.Close(); err != nil {
			s.log.Warn("removing a fork template", "template", ft.t.Name(), "err", err)
		} else {
			s.log.Info("removed a fork template", "task", ft.task, "template", ft.t.Name(), "forks", ft.forks, "why", why)
		}
	}
}

// acquire returns the template of key, marked in use until release, and
// the number of its fork about to start; nil when there is none.
func (s *forkTemplates) acquire(key string) (*forkTemplate, int) {
	if s == nil {
		return nil, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ft := s.byKey[key]
	if ft == nil {
		return nil, 0
	}
	s.uses++
	ft.used = s.uses
	ft.inUse++
	ft.forks++
	return ft, ft.forks
}

// release ends an acquire.
func (s *forkTemplates) release(ft *forkTemplate) {
	s.mu.Lock()
	ft.inUse--
	evicted := s.evictLocked("")
	if ft.dropped && ft.inUse == 0 {
		evicted = append(evicted, ft)
	}
	s.mu.Unlock()
	s.closeAll(evicted, "least recently used beyond Golden.Max, or dropped")
}

// drop unlists a template that failed to fork (no desktop forks it any
// more); it closes once no attempt runs in one of its clones.
func (s *forkTemplates) drop(ft *forkTemplate, why string) {
	s.mu.Lock()
	mine := s.byKey[ft.key] == ft
	if mine {
		delete(s.byKey, ft.key)
		ft.dropped = true
	}
	idle := mine && ft.inUse == 0
	s.mu.Unlock()
	if mine {
		s.log.Warn("dropping a fork template", "task", ft.task, "template", ft.t.Name(), "why", why)
	}
	if idle {
		s.closeAll([]*forkTemplate{ft}, why)
	}
}

// maxFailedForks is how many forks in a row may start a clone that never
// serves (no ports, no answer) before the template goes: a state whose
// guest does not come back would cost every attempt a boot timeout.
const maxFailedForks = 2

// forkDone records how a fork whose clone started ended: served, or
// failed after its start; it says whether the template should go.
func (s *forkTemplates) forkDone(ft *forkTemplate, served bool) (drop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if served {
		ft.failed = 0
		return false
	}
	ft.failed++
	return ft.failed >= maxFailedForks
}

// needsCheck says whether ft's RAM content is still to be checked, and
// marks it checked: once per template.
func (s *forkTemplates) needsCheck(ft *forkTemplate) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ft.checked {
		return false
	}
	ft.checked = true
	return true
}

// close removes every template (their clones die with them).
func (s *forkTemplates) close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	s.closed = true
	all := s.byKey
	s.byKey = map[string]*forkTemplate{}
	s.mu.Unlock()
	var errs []error
	for _, ft := range all {
		errs = append(errs, ft.t.Close())
	}
	return errors.Join(errs...)
}

// forkState is a desktop's side of the fork path. Reset's calls use it one
// at a time; Close may run at any moment, so what it ends (the clone and
// the template it runs from) is kept under mu.
type forkState struct {
	mu sync.Mutex
	// clone holds the current attempt, a fork of using; nil when the VM
	// does.
	clone forkClone
	using *forkTemplate
	// kept is the template of a kept end state being graded
	// (GradeEndState), which Close ends with its clone.
	kept *vm.Template
	// closed says Close ended the clone: one made later is closed at once.
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

// hold runs set under mu unless Close has begun, and says whether it ran:
// what set records, Close then ends.
func (f *forkState) hold(set func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	set()
	return true
}

// endClone closes the clone that held the last attempt. Unless another
// clone follows (keepParked), the VM takes its ports back and runs again.
func (d *Desktop) endClone(ctx context.Context, keepParked bool) error {
	f := &d.golden.fork
	f.mu.Lock()
	c, ft := f.clone, f.using
	f.clone, f.using = nil, nil
	f.mu.Unlock()
	if c != nil {
		if err := c.Close(); err != nil {
			d.log.Warn("closing the last attempt's clone", "clone", c.Name(), "err", err)
		}
		d.dropConnections()
	}
	if ft != nil {
		d.golden.forks.release(ft)
	}
	if !f.parked || keepParked {
		return nil
	}
	if err := d.vm.Unpark(ctx); err != nil {
		return fmt.Errorf("take the VM's ports back from its clones: %w", err)
	}
	f.parked, f.unparked = false, true
	if a := d.golden.agent; a != nil {
		// The VM holds them again; an agent that went has no
		// reservation left to release.
		if err := a.Reserve(ctx, d.vm.Ports(), false); err != nil && !errors.Is(err, hostagent.ErrGone) {
			d.log.Warn("releasing the VM's ports on its host", "err", err)
		}
	}
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

// forkResult is what forkGolden did.
type forkResult struct {
	// ft is the template forked (nil when there was none any more) and
	// n the number of this fork of it.
	ft *forkTemplate
	n  int
	// templateFault says the template itself failed (its QEMU did not
	// start or take the state), not this desktop (parking its VM, its
	// ports, the guest's answer): only then does it go.
	templateFault bool
}

// forkGolden starts the attempt in a clone of the template of key on the
// desktop's ports: the VM parks (paused, its ports freed), the clone
// loads the state and takes the ports, and the guest is thawed as after a
// load (clock, entropy).
func (d *Desktop) forkGolden(ctx context.Context, key string) (forkResult, error) {
	if err := d.endClone(ctx, true); err != nil {
		return forkResult{}, err
	}
	ft, n := d.golden.forks.acquire(templateKey(d.host, key))
	if ft == nil {
		return forkResult{}, errors.New("the task's fork template went (another desktop's fork of it failed, or it was the least recently used)")
	}
	r := forkResult{ft: ft, n: n}
	f := &d.golden.fork
	if !f.hold(func() { f.using = ft }) {
		d.golden.forks.release(ft)
		return r, desktop.ErrClosed
	}
	t0 := time.Now()
	if err := d.park(ctx); err != nil {
		return r, err
	}
	var c forkClone
	var t1, t2, t3 time.Time
	err := d.restore(ctx, ResetGoldenFork, func(ctx context.Context) error {
		t1 = time.Now()
		var err error
		if c, err = ft.t.Fork(ctx); err != nil {
			r.templateFault = !errors.Is(err, vm.ErrClosed)
			return err
		}
		t2 = time.Now()
		err = d.serveClone(ctx, c)
		t3 = time.Now()
		return err
	}, newSeed())
	if c != nil && ctx.Err() == nil && d.closeCtx.Err() == nil && !r.templateFault {
		// The clone started: whether it served says something about the
		// state, unless it failed for the desktop's ports alone (once).
		if d.golden.forks.forkDone(ft, err == nil) {
			r.templateFault = true
		}
	}
	if err != nil {
		return r, err
	}
	started, spare := c.Started()
	d.log.Debug("forked the golden state", "task", ft.task, "clone", c.Name(), "park", t1.Sub(t0), "fork", t2.Sub(t1),
		"clone_restore", c.Restore(), "prestarted", spare, "clone_start", started, "forward_and_answer", t3.Sub(t2), "thaw", time.Since(t3))
	d.spare(ft)
	return r, nil
}

// park pauses the VM and frees its ports for a clone, unless it is parked
// already.
func (d *Desktop) park(ctx context.Context) error {
	f := &d.golden.fork
	if f.parked {
		return nil
	}
	// Parked before Park returns: a Park cut off half way is undone by
	// the next endClone's Unpark, which can run on a VM in any state of
	// it.
	f.parked = true
	if a := d.golden.agent; a != nil {
		// Before the VM frees them: no clone the agent starts takes
		// them meanwhile (on this machine, Park reserves them itself).
		if err := a.Reserve(ctx, d.vm.Ports(), true); err != nil {
			return fmt.Errorf("reserve the VM's ports on its host: %w", err)
		}
	}
	return d.vm.Park(ctx)
}

// serveClone makes c the desktop's clone, which Close ends, forwards the
// desktop's ports to it and waits until its guest answers on them.
func (d *Desktop) serveClone(ctx context.Context, c forkClone) error {
	f := &d.golden.fork
	if !f.hold(func() { f.clone = c }) {
		c.Close()
		return desktop.ErrClosed
	}
	if err := c.Forward(ctx, d.vm.Ports()); err != nil {
		return fmt.Errorf("forward the desktop's ports to clone %s: %w", c.Name(), err)
	}
	d.dropConnections()
	return d.waitGuest(ctx)
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
		if serr := backoff.Sleep(ctx, 20*time.Millisecond); serr != nil {
			return fmt.Errorf("%w (last probe: %v)", context.Cause(ctx), err)
		}
	}
}

// spare starts clones of ft ahead in the background for the next forks:
// as many as desktops run in its clones now (they will want another), at
// least one.
func (d *Desktop) spare(ft *forkTemplate) {
	f := &d.golden.fork
	// Under mu, so that no Add races closeFork's Wait.
	if !f.hold(func() { f.spares.Add(1) }) {
		return
	}
	d.golden.forks.mu.Lock()
	n := min(max(ft.inUse, 1), maxSpareClones)
	d.golden.forks.mu.Unlock()
	go func() {
		defer f.spares.Done()
		// The template's RAM content is checked once, here, off the
		// reset's path (each fork compares the file's stat): a file
		// changed since it was taken makes the next fork fail, which
		// loads the state in place instead.
		if d.golden.forks.needsCheck(ft) {
			t0 := time.Now()
			if err := ft.t.CheckRAM(d.closeCtx); err != nil {
				if !errors.Is(err, vm.ErrBadTemplate) {
					// Cut off or unread: another spare checks it.
					d.golden.forks.mu.Lock()
					ft.checked = false
					d.golden.forks.mu.Unlock()
				}
				if !errors.Is(err, vm.ErrClosed) && d.closeCtx.Err() == nil {
					d.log.Warn("the fork template does not check out; the task's next attempt loads its golden state in place", "template", ft.t.Name(), "err", err)
				}
				return
			}
			d.log.Debug("fork template checked", "template", ft.t.Name(), "took", time.Since(t0))
		}
		if err := ft.t.Prestart(d.closeCtx, n); err != nil && d.closeCtx.Err() == nil && !errors.Is(err, vm.ErrClosed) {
			d.log.Warn("could not start a clone ahead; the next fork starts its own", "template", ft.t.Name(), "err", err)
		}
	}()
}

// takeTemplate captures the running VM, just set up for a task and
// snapshot as g, as the template every desktop of the pool forks the
// task's attempts from. A VM that cannot be captured leaves the golden
// state's in-place load.
func (d *Desktop) takeTemplate(ctx context.Context, g *goldenState) {
	t0 := time.Now()
	t, err := d.template(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("could not take the task's fork template; its attempts load the golden state in place", "task", g.task, "err", err)
		}
		return
	}
	ft := &forkTemplate{t: t, key: templateKey(d.host, g.key), host: d.host, task: g.task, by: d.name, built: g.built, setup: g.setup, execDir: g.execDir}
	d.golden.forks.add(ft)
	tt := t.Timings()
	d.log.Info("took the task's fork template", "task", g.task, "template", t.Name(), "took", time.Since(t0),
		"paused", tt.Paused, "ram_mib", tt.RAMBytes>>20, "state_kib", tt.StateBytes>>10)
	d.spare(ft)
}

// template captures the desktop's VM as a template: here, or through the
// host agent on the VM's host, where its RAM file stays.
func (d *Desktop) template(ctx context.Context) (forkSource, error) {
	if d.golden.agent == nil {
		t, err := d.vm.Template(ctx)
		if err != nil {
			return nil, err
		}
		return hostagent.LocalTemplate(t), nil
	}
	t, err := d.golden.agent.Template(ctx, d.vm.DomainRef())
	if errors.Is(err, vm.ErrSavevmUnsafe) {
		d.vm.RefuseSavevm(err)
	}
	if err != nil {
		return nil, err
	}
	return remoteTemplate{t}, nil
}

// closeFork ends the fork path for Close: the clone, its hold on the
// template, the background starts. The templates are the pool's.
func (d *Desktop) closeFork() error {
	f := &d.golden.fork
	f.mu.Lock()
	f.closed = true
	c, ft, kept := f.clone, f.using, f.kept
	f.clone, f.using, f.kept = nil, nil, nil
	f.mu.Unlock()
	var err error
	if c != nil {
		err = c.Close()
	}
	if kept != nil {
		err = errors.Join(err, kept.Close())
	}
	if ft != nil {
		d.golden.forks.release(ft)
	}
	f.spares.Wait()
	return err
}
