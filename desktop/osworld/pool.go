package osworld

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/setup"
	"legato/rl/desktop/osworld/vm"
)

// Pool makes the desktops of a batch, one per worker slot: it boots a VM
// (or attaches to the slot's guest URL) for each, replaces failed ones when
// asked again for their slot, and shares between them the download cache,
// the grader's catalog and the processes that run OSWorld's Python
// evaluators. Its methods are safe for concurrent use.
type Pool struct {
	cfg       Config
	log       *slog.Logger
	downloads *setup.Cache
	catalog   *grade.Catalog
	graders   *grade.Pool // nil when grading natively only
	// forks are the golden states' fork templates every desktop on this
	// machine forks from; nil without Golden.Fork.
	forks *forkTemplates

	// images are VM mode's image files, hashed once at the start.
	images []vm.ImageFile
	// watch resolves Config.HostsFrom (nil without it).
	watch *hostdns.Watcher
	// prepare is prepareHost; tests replace it.
	prepare func(ctx context.Context, ph *poolHost, leftBy string) error
	// stopProbes, stopCtx and probes run the probes of VM mode's hosts
	// that are down (or just joined), and the goroutine that follows
	// watch.
	stopProbes chan struct{}
	stopCtx    context.Context
	stopNow    context.CancelFunc
	probes     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	// hosts are the libvirt hosts of VM mode; with Config.HostsFrom, the
	// list changes during the batch (a new slice each time).
	hosts []*poolHost
	open  map[*Desktop]int // open desktop → slot
	// changed is closed (and replaced) whenever a host's state or load
	// changes, waking desktops that wait for a slot.
	changed chan struct{}
}

// NewPool checks cfg and prepares the shared parts. In VM mode it
// connects to each of cfg.VM.Hosts (or of those cfg.HostsFrom resolves
// to, which it follows until Close), uploads the image files to the hosts
// that lack them (unless NoImageUpload), and removes what a crashed run
// left behind: every domain and volume of VMs with cfg.VM.NamePrefix (so
// runs sharing a host at the same time need different prefixes). A host
// that does not answer is tried again in the background; only when none
// does is it an error. With an OSWorld checkout it starts the grader
// processes every desktop shares (cfg.Grade.Workers of them) and waits for
// the first, which lists the evaluators the checkout provides; the others
// get ready while the desktops boot.
func NewPool(ctx context.Context, cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("osworld config: %w", err)
	}
	cfg = cfg.withDefaults()
	p := &Pool{cfg: cfg, log: cfg.Logger, open: map[*Desktop]int{}, changed: make(chan struct{})}
	p.prepare = p.prepareHost
	if cfg.Golden.Fork && !cfg.Golden.Off {
		p.forks = newForkTemplates(cfg.Golden.Max, cfg.Logger)
		p.forks.spread = cfg.HostsFrom != nil || len(cfg.VM.Hosts) > 1
		if os.Geteuid() != 0 {
			p.log.Warn("golden states fork only when legato runs as root (it reads guest RAM out of libvirt's QEMU): they load in place instead")
		}
	}
	p.stopCtx, p.stopNow = context.WithCancel(context.Background())
	if cfg.vmMode() {
		if err := p.openHosts(ctx); err != nil {
			p.stopNow()
			return nil, err
		}
	}
	var err error
	p.downloads, err = setup.NewCache(filepath.Join(cfg.CacheDir, "downloads"), setup.CacheOptions{Logger: cfg.Logger})
	if err != nil {
		p.closeHosts()
		return nil, fmt.Errorf("download cache: %w", err)
	}
	if cfg.Grade.OSWorldDir != "" && cfg.Grade.Mode != grade.NativeOnly {
		p.graders, err = grade.NewPool(grade.PoolConfig{
			OSWorldDir:  cfg.Grade.OSWorldDir,
			Python:      cfg.Grade.Python,
			Workers:     cfg.Grade.Workers,
			BytecodeDir: filepath.Join(cfg.CacheDir, "pycache"),
			Logger:      cfg.Logger,
		})
		if err != nil {
			p.closeHosts()
			return nil, err
		}
		p.catalog, err = grade.LoadCatalog(ctx, p.graderConfig())
		if err != nil {
			p.graders.Close()
			p.closeHosts()
			return nil, fmt.Errorf("list the OSWorld checkout's evaluators: %w", err)
		}
	} else {
		p.catalog = grade.NativeCatalog()
	}
	return p, nil
}

// graderConfig is the part of a grader's configuration shared by every
// desktop.
func (p *Pool) graderConfig() grade.GraderConfig {
	return grade.GraderConfig{
		Pool:        p.graders,
		Mode:        p.cfg.Grade.Mode,
		Timeout:     p.cfg.Grade.Timeout,
		DownloadDir: filepath.Join(p.cfg.CacheDir, "cloud-files"),
		Catalog:     p.catalog,
		Logger:      p.cfg.Logger,
	}
}

// CheckTasks reports, before a batch, the tasks these desktops cannot run:
// a setup step that does not parse or that legato refuses, an evaluator
// whose metric or getter is missing, a chrome_* step on guests without a
// DevTools port. The errors wrap desktop.ErrUnsupported where retrying
// cannot help. It also warns about tasks that need a snapshot revert when
// the guests have none.
func (p *Pool) CheckTasks(tasks []desktop.Task) error {
	var errs []error
	warned := map[string]bool{}
	ids := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		ids[t.ID] = true
	}
	for _, id := range p.cfg.Golden.Refuse {
		if !ids[id] {
			errs = append(errs, fmt.Errorf("Golden.Refuse (--golden-refuse) names task %q, which is not among the batch's tasks: check the id", id))
		}
	}
	for _, t := range tasks {
		if err := setup.Check(t, t.Setup); err != nil {
			errs = append(errs, fmt.Errorf("task %s: %w", t.ID, err))
		}
		if err := p.catalog.Check(t); err != nil {
			errs = append(errs, err)
		}
		if p.cfg.vmMode() {
			continue
		}
		if (p.cfg.NoFastReset || p.cfg.revertDomain(t.Domain)) && !warned[t.Domain] {
			warned[t.Domain] = true
			p.log.Warn("tasks of this domain need a snapshot revert, which guests given by URL cannot do: they will be fast-reset",
				"domain", t.Domain, "first_task", t.ID)
		}
		for i, g := range p.cfg.Guests {
			if g.DevToolsPort != 0 {
				continue
			}
			if err := checkBrowser(t, false); err != nil {
				errs = append(errs, fmt.Errorf("guest %d (%s): %w", i, g.URL, err))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// New creates the desktop of a worker slot: in VM mode it boots a VM,
// prepares its home baseline and takes the clean snapshot; with guests
// given by URL it attaches to Guests[slot]. A desktop of the same slot that
// is still open is closed first: New is how the scheduler replaces a
// desktop that failed. New implements desktop.Factory.
func (p *Pool) New(ctx context.Context, slot int) (desktop.Desktop, error) {
	if slot < 0 {
		return nil, fmt.Errorf("desktop slot %d: want 0 or more", slot)
	}
	if !p.cfg.vmMode() && slot >= len(p.cfg.Guests) {
		return nil, fmt.Errorf("desktop slot %d: only %d guest URLs were given (one --guest-url per desktop): run at most %d desktops",
			slot, len(p.cfg.Guests), len(p.cfg.Guests))
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("desktop pool closed")
	}
	var old []*Desktop
	for d, s := range p.open {
		if s == slot {
			old = append(old, d)
		}
	}
	p.mu.Unlock()
	for _, d := range old {
		p.log.Warn("closing the slot's previous desktop before replacing it", "slot", slot, "desktop", d.name)
		if err := d.Close(); err != nil {
			p.log.Error("close replaced desktop", "slot", slot, "err", err)
		}
	}

	var (
		d   *Desktop
		ph  *poolHost
		err error
	)
	if p.cfg.vmMode() {
		if ph, err = p.acquire(ctx); err != nil {
			return nil, &desktop.Error{Op: "start vm", Desktop: "slot " + strconv.Itoa(slot), Err: err}
		}
		d, err = p.startVM(ctx, slot, ph)
		if err != nil {
			p.release(ph, "")
			if hostFailure(err) && ctx.Err() == nil {
				p.hostDown(ph, err)
			}
		}
	} else {
		d, err = p.attach(ctx, p.cfg.Guests[slot])
	}
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		d.Close()
		if ph != nil {
			p.release(ph, d.name)
		}
		return nil, errors.New("desktop pool closed")
	}
	p.open[d] = slot
	if ph != nil {
		ph.vms[d.name] = true
	}
	p.mu.Unlock()
	d.release = func() {
		p.mu.Lock()
		delete(p.open, d)
		p.mu.Unlock()
		if ph != nil {
			p.release(ph, d.name)
		}
	}
	if ph != nil {
		d.leaving = p.leavingOf(ph)
	}
	if d.vm != nil {
		return &VMDesktop{d}, nil
	}
	return d, nil
}

// Close closes every desktop the pool made that is still open (in VM mode:
// destroys the VMs) and refuses new ones. It is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.notifyLocked()
	ds := make([]*Desktop, 0, len(p.open))
	for d := range p.open {
		ds = append(ds, d)
	}
	p.mu.Unlock()
	var errs []error
	for _, d := range ds {
		if err := d.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if p.graders != nil {
		if err := p.graders.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close grader pool: %w", err))
		}
	}
	// After the desktops: none runs in a clone any more.
	if err := p.forks.close(); err != nil {
		errs = append(errs, fmt.Errorf("remove fork templates: %w", err))
	}
	if err := p.closeHosts(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Config returns the pool's configuration, defaults filled in.
func (p *Pool) Config() Config { return p.cfg }

// Graders returns the processes that run OSWorld's evaluators for every
// desktop (their Stats, their Interpreter); nil when grading natively only.
func (p *Pool) Graders() *grade.Pool { return p.graders }

// attachTry bounds one readiness probe of a guest given by URL.
const attachTry = 10 * time.Second

// attach makes the desktop of a guest that already runs.
func (p *Pool) attach(ctx context.Context, addr GuestAddr) (*Desktop, error) {
	c, err := guest.New(addr.URL, guest.Options{Timeouts: p.cfg.GuestTimeouts, Logger: p.cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("guest %s: %w", addr.URL, err)
	}
	fail := func(op string, err error) error {
		c.CloseIdleConnections()
		return &desktop.Error{Op: op, Desktop: addr.URL, Err: err}
	}
	if err := c.WaitReady(ctx, min(attachTry, p.cfg.BootTimeout), p.cfg.BootTimeout); err != nil {
		return nil, fail("attach", err)
	}
	sh := &guestShell{client: c, password: p.cfg.ClientPassword, toolCache: p.cfg.toolCacheDir(), helper: p.cfg.helperDir()}
	if err := sh.detectRoot(ctx); err != nil {
		return nil, fail("attach", err)
	}
	cc, err := p.cfg.cleanConfig()
	if err != nil {
		return nil, fail("attach", err)
	}
	// A guest given by URL has no snapshot: its clean state is what it is
	// now, unless an earlier run recorded it in this boot.
	cc.KeepSameBoot = true
	rec, err := sh.recordClean(ctx, cc)
	if err != nil {
		return nil, fail("attach", err)
	}
	if rec.HomeBaseline == "created" {
		p.log.Warn("the guest had no home baseline: made one from its home as it is now; fast resets restore that state",
			"guest", addr.URL, "home", p.cfg.Home, "baseline", p.cfg.BaselineDir)
	}
	if !rec.Kept {
		p.log.Warn("recorded the guest's clean state as it is now (processes, windows, "+strings.Join(p.cfg.FastReset.Restore, ", ")+"): fast resets bring it back to that",
			"guest", addr.URL, "processes", rec.Processes, "session", rec.sessionText(), "record_s", rec.Seconds)
	}
	if rec.Windows == nil && !rec.Kept {
		p.log.Warn("fast resets cannot check the guest's windows", "guest", addr.URL, "why", rec.WindowsWhy)
	}
	d, err := p.newDesktop(ctx, addr.URL, addr, c, sh, nil, nil)
	if err != nil {
		return nil, fail("attach", err)
	}
	return d, nil
}

// startVM boots the VM of a slot. The VM takes its clean snapshot once the
// guest answers; the probe it calls first makes the home baseline and waits
// for a settled screen, so that the snapshot holds both.
func (p *Pool) startVM(ctx context.Context, slot int, ph *poolHost) (*Desktop, error) {
	// A failed preparation cancels the boot with its error: the probe
	// would otherwise be retried until the boot timeout.
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var dial dialFunc
	if ph.h.Remote() {
		dial = ph.h.DialContext
	}
	prep := &vmPrep{pool: p, startCtx: sctx, abort: cancel, dial: dial}
	vcfg := p.cfg.VM
	// A VM on this machine can give fork templates and keep end states
	// (both read QEMU's command line, and a clone runs on it); one on a
	// remote host gives templates through the host's agent.
	agent := p.agentOf(ph)
	vcfg.Fork = forkVM(p.forks != nil, p.cfg.EndStates != "", ph.h.Remote(), agent != nil)
	vcfg.Ready = prep.ready
	vcfg.BootTimeout = p.cfg.BootTimeout
	if vcfg.BootCache != "" {
		key, err := p.cfg.bootCacheKey()
		if err != nil {
			return nil, &desktop.Error{Op: "start vm", Desktop: "slot " + strconv.Itoa(slot) + " on " + ph.name(), Err: err}
		}
		vcfg.BootCacheKey = key
	}
	v, err := vm.StartOn(sctx, ph.h, vcfg, slot)
	prep.done.Store(true)
	prep.forgetOffset()
	if err != nil {
		return nil, &desktop.Error{Op: "start vm", Desktop: "slot " + strconv.Itoa(slot) + " on " + ph.name(), Err: err}
	}
	ports := v.Ports()
	addr := GuestAddr{URL: ports.GuestURL(), DevToolsPort: ports.DevTools, VLCPort: ports.VLC}
	opts := guest.Options{Timeouts: p.cfg.GuestTimeouts, Logger: p.cfg.Logger}
	if dial != nil {
		opts.HTTPClient = hostHTTP(dial, true)
	}
	c, err := guest.New(addr.URL, opts)
	if err == nil {
		sh := &guestShell{client: c, password: p.cfg.ClientPassword, asRoot: prep.asRoot, toolCache: p.cfg.toolCacheDir(), helper: p.cfg.helperDir()}
		var d *Desktop
		restored := v.Timings().Restored
		if restored {
			// Started from the boot cache: the probe did not prepare
			// the guest, so it did not ask the guest's user either.
			err = sh.detectRoot(ctx)
		} else {
			// The clock was set before the snapshot, but the snapshot
			// took time.
			err = sh.setClock(ctx)
		}
		if err == nil {
			d, err = p.newDesktop(ctx, v.Name(), addr, c, sh, v, dial)
		}
		if err == nil {
			d.history.fresh = true
			d.host = ph.name()
			d.probe = prep
			if agent != nil && vcfg.Fork {
				// Decided once: this desktop forks through the agent.
				d.golden.forks, d.golden.agent = p.forks, agent
			}
			if !restored {
				return d, nil
			}
			// The guest's clock and random generator are where another
			// VM's were at its snapshot: thawed as after a snapshot load
			// (the load itself is done).
			err = d.restore(ctx, ResetNone, func(context.Context) error { return nil }, newSeed())
			if err == nil {
				return d, nil
			}
			// Close ends the VM with the desktop's own files.
			if cerr := d.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
			return nil, &desktop.Error{Op: "start vm", Desktop: v.Name(), Err: err}
		}
	}
	if cerr := v.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return nil, &desktop.Error{Op: "start vm", Desktop: v.Name(), Err: err}
}

// forkVM says whether a VM starts forkable (vm.Config.Fork): for the
// pool's fork templates (fork) on this machine or on a remote host with a
// host agent, or to keep end states (keep), which only a VM on this
// machine can.
func forkVM(fork, keep, remote, agent bool) bool {
	if remote {
		return fork && agent
	}
	return fork || keep
}

// vmPrep is the readiness probe of a booting VM. The first time the guest
// answers, it prepares the clean state (a settled screen, the clock, the
// clean-state record with the home baseline) before vm.Start takes the
// snapshot. Afterwards, for reverts, its probe asks the guest for its time,
// so that the revert that waits for it learns the clock's offset without a
// call of its own. vm.Start and the reverts call it one call at a time.
type vmPrep struct {
	pool *Pool
	// startCtx is the ctx of the boot. The probe's own ctx is bounded by
	// the short vm.Config.ReadyTry, too short for the preparation; done is
	// set when Start returns, after which the probe never uses startCtx.
	startCtx context.Context
	abort    context.CancelCauseFunc
	done     atomic.Bool
	prepared bool
	asRoot   bool
	client   *guest.Client
	// dial reaches the VM's host (nil: this machine).
	dial dialFunc

	mu     sync.Mutex
	off    time.Duration // the guest clock's offset the last probe measured
	rtt    time.Duration // the round trip of that reading
	offSet bool
}

// offset returns the guest clock's offset that the probe measured when the
// guest answered after the last revert, and the reading's round trip. It
// is safe on a nil vmPrep.
func (v *vmPrep) offset() (off, rtt time.Duration, ok bool) {
	if v == nil {
		return 0, 0, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.off, v.rtt, v.offSet
}

// forgetOffset drops the measured offset before the guest changes.
func (v *vmPrep) forgetOffset() {
	if v == nil {
		return
	}
	v.mu.Lock()
	v.offSet = false
	v.mu.Unlock()
}

func (v *vmPrep) ready(ctx context.Context, ports vm.Ports) error {
	if v.client == nil {
		// No keep-alive: a probe's connection must not outlive a revert
		// of the guest behind it.
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		if v.dial != nil {
			hc = hostHTTP(v.dial, false)
		}
		c, err := guest.New(ports.GuestURL(), guest.Options{HTTPClient: hc, Timeouts: v.pool.cfg.GuestTimeouts})
		if err != nil {
			return err
		}
		v.client = c
	}
	if v.prepared || v.done.Load() || vm.Restoring(ctx) {
		// A revert, or a start from the boot cache: the clean state
		// was prepared before its snapshot.
		off, rtt, err := clockOffset(ctx, v.client)
		if err != nil {
			return err
		}
		v.mu.Lock()
		v.off, v.rtt, v.offSet = off, rtt, true
		v.mu.Unlock()
		return nil
	}
	if _, _, err := v.client.ScreenSize(ctx); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(v.startCtx, v.pool.cfg.PrepareTimeout)
	defer cancel()
	err := v.prepare(pctx)
	if guest.IsNotReady(err) && pctx.Err() == nil {
		// A guest that just booted under software emulation may drop a
		// connection; every step of the preparation can run again.
		v.pool.log.Warn("preparing the clean state: the guest dropped a call; preparing again", "err", err)
		err = v.prepare(pctx)
	}
	if err != nil {
		err = fmt.Errorf("prepare the clean state before the snapshot: %w", err)
		v.abort(err)
		return err
	}
	v.prepared = true
	return nil
}

// prepare waits for a settled screen, sets the clock, then records the
// clean state (and makes the home baseline).
func (v *vmPrep) prepare(ctx context.Context) error {
	p := v.pool
	sh := &guestShell{client: v.client, password: p.cfg.ClientPassword, toolCache: p.cfg.toolCacheDir(), helper: p.cfg.helperDir()}
	if err := sh.detectRoot(ctx); err != nil {
		return err
	}
	v.asRoot = sh.asRoot
	// Settle first: programs still starting (the window manager, font
	// caches) write to the home, and the baseline must hold what they
	// wrote.
	d := &Desktop{cfg: p.cfg, guest: v.client, sh: sh, log: p.log}
	if _, err := d.readySignal(ctx, p.cfg.Ready.AfterResetMax, waitFor{}); err != nil {
		return err
	}
	// The record's time stamp, and every later change's time, must come
	// from a clock that is right: the emulated RTC is seconds off under
	// software emulation.
	if err := sh.setClock(ctx); err != nil {
		return err
	}
	cc, err := p.cfg.cleanConfig()
	if err != nil {
		return err
	}
	rec, err := sh.recordClean(ctx, cc)
	if err != nil {
		return err
	}
	windows := -1
	if rec.Windows != nil {
		windows = *rec.Windows
	}
	p.log.Info("recorded the clean state", "processes", rec.Processes, "windows", windows,
		"writable_entries", rec.Writable, "session", rec.sessionText(), "seconds", rec.Seconds)
	if rec.Windows == nil {
		p.log.Warn("fast resets cannot check the guest's windows", "why", rec.WindowsWhy)
	}
	return nil
}

// newDesktop assembles a desktop around a guest that answers.
// dial, when not nil, reaches the guest's ports on a remote host: the
// setup's Chrome DevTools client uses it, and the grader's Python getters
// get local forwards through it.
func (p *Pool) newDesktop(ctx context.Context, name string, addr GuestAddr, c *guest.Client, sh *guestShell, v *vm.VM, dial dialFunc) (*Desktop, error) {
	w, h, err := c.ScreenSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("screen size: %w", err)
	}
	tmp, err := os.MkdirTemp("", "legato-osworld-")
	if err != nil {
		return nil, err
	}
	log := p.log.With("desktop", name)
	ctrl := &setup.Controller{
		Guest:          c,
		Downloads:      p.downloads,
		OutputDir:      filepath.Join(tmp, "setup-output"),
		LocalDir:       p.cfg.Grade.OSWorldDir,
		ScreenWidth:    w,
		ScreenHeight:   h,
		ClientPassword: p.cfg.ClientPassword,
		Windows:        sh,
		WindowWait:     p.cfg.Ready.AfterLaunchMax,
		Logger:         log,
	}
	var fwd forwards
	fail := func(err error) (*Desktop, error) {
		fwd.close()
		os.RemoveAll(tmp)
		return nil, err
	}
	if ep := addr.devToolsEndpoint(); ep != "" {
		var hc *http.Client
		if dial != nil {
			hc = hostHTTP(dial, true)
		}
		ctrl.Browser, err = cdp.New(ep, hc)
		if err != nil {
			return fail(fmt.Errorf("devtools endpoint: %w", err))
		}
	}
	gcfg := p.graderConfig()
	gcfg.CacheDir = filepath.Join(tmp, "grade")
	gcfg.Env = grade.Env{Host: addr.host(), ServerPort: addr.serverPort(), ChromiumPort: addr.DevToolsPort, VLCPort: addr.VLCPort}
	if dial != nil && p.graders != nil {
		// OSWorld's getters connect to the ports themselves.
		env := grade.Env{Host: "127.0.0.1"}
		for _, f := range []struct {
			port int
			to   *int
		}{{addr.serverPort(), &env.ServerPort}, {addr.DevToolsPort, &env.ChromiumPort}, {addr.VLCPort, &env.VLCPort}} {
			if *f.to, err = fwd.add(dial, addr.host(), f.port); err != nil {
				return fail(fmt.Errorf("forward a guest port for the grader: %w", err))
			}
		}
		gcfg.Env = env
	}
	gcfg.Guest = grade.GuestClient(c)
	gcfg.Logger = log
	gcfg.PostConfig = func(ctx context.Context, task desktop.Task, steps []desktop.SetupStep, cacheDir string) error {
		c := *ctrl
		c.OutputDir = cacheDir
		return c.Run(ctx, task, steps)
	}
	g, err := grade.New(gcfg)
	if err != nil {
		return fail(fmt.Errorf("grader: %w", err))
	}
	d := &Desktop{
		name:   name,
		cfg:    p.cfg,
		vm:     v,
		guest:  c,
		sh:     sh,
		setup:  ctrl,
		grader: g,
		log:    log,
		tmpDir: tmp,
		fwd:    fwd,
	}
	d.history.warned = map[string]bool{}
	if v != nil && v.Forkable() {
		// Decided once: this desktop forks the pool's templates.
		d.golden.forks = p.forks
	}
	d.closeCtx, d.closeNow = context.WithCancel(context.Background())
	// The ready signal plans its last screenshot to end by its bound: it
	// needs to know what one costs from its first wait on.
	if _, err := d.timedShot(ctx); err != nil {
		d.Close()
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	log.Info("desktop ready", "guest", addr.URL, "screen", fmt.Sprintf("%dx%d", w, h), "as_root", sh.asRoot)
	return d, nil
}
