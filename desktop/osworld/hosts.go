package osworld

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
	"legato/rl/internal/backoff"
)

// Defaults of the host fleet's knobs in Config.
const (
	// DefaultHostWait bounds how long a new desktop waits for a host with
	// a free slot.
	DefaultHostWait = 10 * time.Minute
	// DefaultHostRetryMax caps the backoff between tries of a host that
	// stopped answering.
	DefaultHostRetryMax = time.Minute
)

// hostRetryMin is the first wait before a host that went down is tried
// again; each failed try doubles it, up to Config.HostRetryMax.
const hostRetryMin = time.Second

// poolHost is one libvirt host of a pool: its transport, its cap, the
// desktops on it and whether it answers. Every field but h and cap is
// guarded by Pool.mu.
type poolHost struct {
	h   *vm.Host
	cap int // 0: no cap

	// inUse counts the desktops open or starting on the host.
	inUse int
	// vms are the VMs of the desktops open on the host, which a sweep of
	// the host must keep.
	vms map[string]bool
	// down: the host stopped answering (or was never reached); it gets no
	// desktop until a probe at retryAt succeeds.
	down    bool
	err     error
	retryAt time.Time
	// downs counts the tries that found the host down since it last
	// answered; backoff is the wait after the last of them.
	downs   int
	backoff time.Duration
	probing bool
	// unclean: desktops were lost on the host while it was down; the
	// probe that brings it back sweeps them.
	unclean bool
	// joined: the host came from Config.HostsFrom during the batch and
	// was never prepared yet (it starts down, for the probes to prepare).
	joined bool
	// leaving: the host left Config.HostsFrom's records: it gets no new
	// desktop, its desktops ask to be replaced after their attempt, and
	// once it has none it is dropped (dropLeftLocked). gone: it was.
	leaving bool
	gone    bool
	// agent forks golden states on a remote host (package hostagent),
	// nil without one; agentAsked: the host was asked for one, and one
	// without an agent is not asked again (it said so once).
	agent      *hostagent.Client
	agentAsked bool
}

func (ph *poolHost) name() string { return ph.h.Name() }

// free returns the host's free slots (math.MaxInt without a cap).
func (ph *poolHost) free() int {
	if ph.cap == 0 {
		return math.MaxInt
	}
	return ph.cap - ph.inUse
}

// hostLoad is what placement knows of a host.
type hostLoad struct {
	up         bool
	cap, inUse int
}

// pickHost returns the host a new desktop goes to: among the hosts that
// answer and have a free slot, the one with the most free slots (a host
// without a cap has more than any), then the one with the fewest desktops,
// then the first. It returns -1 when no host can take one.
func pickHost(hosts []hostLoad) int {
	best := -1
	var bestFree, bestUsed int
	for i, h := range hosts {
		free := math.MaxInt
		if h.cap > 0 {
			free = h.cap - h.inUse
		}
		if !h.up || free <= 0 {
			continue
		}
		if best < 0 || free > bestFree || (free == bestFree && h.inUse < bestUsed) {
			best, bestFree, bestUsed = i, free, h.inUse
		}
	}
	return best
}

// ImageFiles returns the files VM mode's desktops boot (base image, kernel,
// initrd) with their hashes; none for guests given by URL.
func (p *Pool) ImageFiles() []vm.ImageFile { return slices.Clone(p.images) }

// openHosts opens cfg's hosts (those Config.HostsFrom resolves to, when
// set) and prepares each (see prepareHost), all at once. A host that
// cannot be prepared is marked down and tried again later; only when none
// can be is it an error.
func (p *Pool) openHosts(ctx context.Context) error {
	files, err := vm.ImageFiles(ctx, p.cfg.VM)
	if err != nil {
		return err
	}
	p.images = files
	specs := p.cfg.VM.Hosts
	var changed <-chan struct{}
	if src := p.cfg.HostsFrom; src != nil {
		if p.watch, err = hostdns.Watch(ctx, *src, p.log); err != nil {
			return err
		}
		specs, changed = p.watch.Hosts()
		p.log.Info("hosts from DNS", "name", src.Name, "hosts", len(specs))
	}
	for _, spec := range specs {
		ph, err := p.openHost(spec)
		if err != nil {
			p.closeHosts()
			return err
		}
		p.mu.Lock()
		p.hosts = append(p.hosts, ph)
		p.mu.Unlock()
	}
	p.mu.Lock()
	hosts := p.hosts
	p.mu.Unlock()
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, ph := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.prepare(ctx, ph, "an earlier run")
		}()
	}
	wg.Wait()
	up := 0
	for i, ph := range hosts {
		if errs[i] == nil {
			up++
			continue
		}
		if ctx.Err() != nil {
			p.closeHosts()
			return context.Cause(ctx)
		}
		p.hostDown(ph, errs[i])
	}
	if up == 0 {
		p.closeHosts()
		return fmt.Errorf("no host could be used: %w", errors.Join(errs...))
	}
	p.stopProbes = make(chan struct{})
	p.probes.Add(1)
	go p.probeLoop()
	if p.watch != nil {
		p.probes.Add(1)
		go p.followHosts(changed)
	}
	return nil
}

// openHost opens a host's transport (it does not connect yet).
func (p *Pool) openHost(spec vm.HostSpec) (*poolHost, error) {
	ph := &poolHost{cap: spec.Desktops, vms: map[string]bool{}}
	h, err := vm.OpenHost(spec, p.cfg.VM, vm.HostOptions{Images: p.images, Lost: func(_ *vm.Host, err error) { p.hostDown(ph, err) }})
	if err != nil {
		return nil, err
	}
	ph.h = h
	return ph, nil
}

// followHosts applies each set of hosts Config.HostsFrom resolves to
// (hostsChanged), from the one after changed on, until the pool closes.
func (p *Pool) followHosts(changed <-chan struct{}) {
	defer p.probes.Done()
	for {
		select {
		case <-p.stopProbes:
			return
		case <-changed:
		}
		var specs []vm.HostSpec
		specs, changed = p.watch.Hosts()
		p.hostsChanged(specs)
	}
}

// errJoined is why a host that just joined takes no desktop yet.
var errJoined = errors.New("joined: being prepared")

// hostsChanged makes specs the pool's hosts. A host new to them joins: it
// starts down, so that the probes prepare it in the background as they do
// a host that comes back (it answers, holds the image files, keeps no VM
// of the prefix), and then takes desktops. A host gone from them is
// leaving: it takes no new desktop, the desktops on it finish their
// attempt and then ask their worker to replace them (Desktop.Retiring),
// which puts the replacement on another host; with none left, the probe
// loop drops it (dropLeftLocked). A leaving host that is back in specs
// takes desktops again. Hosts are told apart by their whole spec.
func (p *Pool) hostsChanged(specs []vm.HostSpec) {
	want := map[string]bool{}
	for _, s := range specs {
		want[s.String()] = true
	}
	have := map[string]bool{}
	var left, back []string
	p.mu.Lock()
	for _, ph := range p.hosts {
		key := ph.h.Spec().String()
		have[key] = true
		switch {
		case !want[key] && !ph.leaving:
			ph.leaving = true
			left = append(left, ph.name())
		case want[key] && ph.leaving:
			ph.leaving = false
			back = append(back, ph.name())
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
	var joined []*poolHost
	for _, spec := range specs {
		if have[spec.String()] {
			continue
		}
		ph, err := p.openHost(spec)
		if err != nil {
			p.log.Warn("a host the DNS name gives cannot be used", "host", spec.Label(), "err", err)
			continue
		}
		ph.down, ph.err, ph.joined, ph.retryAt = true, errJoined, true, time.Now()
		joined = append(joined, ph)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for _, ph := range joined {
			ph.h.Close()
		}
		return
	}
	p.hosts = append(slices.Clip(p.hosts), joined...)
	p.notifyLocked()
	p.mu.Unlock()
	for _, ph := range joined {
		p.log.Info("a host joined: it takes desktops once prepared", "host", ph.name())
	}
	if len(left) > 0 {
		p.log.Warn("hosts left the DNS name: they take no new desktop; theirs finish their attempt and move to other hosts", "hosts", left)
	}
	if len(back) > 0 {
		p.log.Info("hosts that were leaving are back in the DNS name: they take desktops again", "hosts", back)
	}
}

// leavingOf returns what a desktop on ph asks to know whether it should
// be replaced (Desktop.Retiring).
func (p *Pool) leavingOf(ph *poolHost) func() bool {
	return func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return ph.leaving
	}
}

// dropLeftLocked takes out of the pool the leaving hosts it can let go:
// without desktops, without a probe under way, and without desktops lost
// there while it was down (a probe that finds it again sweeps them first;
// one that never does leaves it for closeHosts to report). It returns
// them, for closeLeft outside p.mu.
func (p *Pool) dropLeftLocked() []*poolHost {
	var gone []*poolHost
	var keep []*poolHost
	for _, ph := range p.hosts {
		if ph.leaving && ph.inUse == 0 && !ph.probing && !(ph.down && ph.unclean) {
			ph.gone = true
			gone = append(gone, ph)
			continue
		}
		keep = append(keep, ph)
	}
	if len(gone) > 0 {
		p.hosts = keep
		p.notifyLocked()
	}
	return gone
}

// closeLeft closes the connections of hosts dropped from the pool.
func (p *Pool) closeLeft(gone []*poolHost) {
	for _, ph := range gone {
		p.closeAgent(ph)
		ph.h.Close()
		p.log.Info("a host that left has no desktop any more: closed its connection", "host", ph.name())
	}
}

// prepareHost readies a host for desktops: it must answer, hold the image
// files (they are uploaded where missing, unless NoImageUpload), and keep
// no VM of the run's prefix other than the pool's open ones (what a
// crashed run, or this batch while the host was down, left there).
func (p *Pool) prepareHost(ctx context.Context, ph *poolHost, leftBy string) error {
	h := ph.h
	if err := h.Ping(ctx); err != nil {
		return err
	}
	states, err := h.CheckImages(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, s := range states {
		if !s.Matches {
			missing = append(missing, fmt.Sprintf("%s (%s)", s.Volume, s.Why))
		}
	}
	if len(missing) > 0 {
		if p.cfg.NoImageUpload {
			return fmt.Errorf("%w: host %s lacks %s; run `legato rl hosts sync`", vm.ErrImageMissing, h.Name(), strings.Join(missing, ", "))
		}
		p.log.Info("uploading the image files the host lacks", "host", h.Name(), "files", missing)
		t0 := time.Now()
		if _, err := h.SyncImages(ctx, nil); err != nil {
			return err
		}
		p.log.Info("uploaded the image files", "host", h.Name(), "took", time.Since(t0).Round(time.Millisecond))
	}
	removed, err := h.Sweep(ctx, p.cfg.VM.NamePrefix, func(name string) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return ph.vms[name]
	})
	if len(removed) > 0 {
		p.log.Warn("removed VMs left behind by "+leftBy, "host", h.Name(), "vms", removed)
	}
	if h.Remote() && p.forks != nil {
		p.startAgent(ctx, ph)
	}
	if !h.Remote() {
		// Fork templates live on this machine (ours are locked), also
		// those of a run with --golden-fork before this one without.
		forks, ferr := vm.SweepForks(p.cfg.VM.ForkDir, p.cfg.VM.NamePrefix)
		for _, l := range forks {
			p.log.Warn("removed a fork template left behind by "+leftBy, "dir", l.Dir, "clones_killed", len(l.Processes))
		}
		if ferr != nil {
			// Not the host's fault: its VMs run all the same.
			p.log.Warn("could not remove every fork template left behind; legato rl gc --fork-dir removes them", "dir", p.cfg.VM.ForkDir, "err", ferr)
		}
		if p.cfg.EndStates != "" {
			// Kept end states cut off half-written (ours are locked
			// while they are written).
			kept, kerr := vm.SweepKept(p.cfg.EndStates)
			for _, k := range kept {
				p.log.Warn("removed an end state left half-written by "+leftBy, "dir", k)
			}
			if kerr != nil {
				p.log.Warn("could not remove every half-written end state", "dir", p.cfg.EndStates, "err", kerr)
			}
		}
	}
	return err
}

// agentCloseTimeout bounds the wait for a host agent to end what its
// session made (it kills QEMUs and removes their files) after the session
// closed.
const agentCloseTimeout = time.Minute

// startAgent starts the host agent on a remote host, which forks its
// desktops' golden states there, unless one runs; it first removes what a
// killed agent left. A host without one says so once and keeps loading
// golden states in place.
func (p *Pool) startAgent(ctx context.Context, ph *poolHost) {
	p.mu.Lock()
	a, asked := ph.agent, ph.agentAsked
	ph.agentAsked = true
	p.mu.Unlock()
	switch {
	case a != nil && a.Err() == nil:
		return
	case a == nil && asked:
		return
	case a != nil:
		// Its session ended with the host's connection.
		a.Close(0)
	}
	argv := hostagent.Command(p.cfg.VM.HostAgent, p.cfg.VM.ForkDir, p.cfg.VM.NamePrefix)
	c, hello, err := hostagent.Dial(ctx, ph.h, argv, p.log)
	if err == nil {
		var swept []string
		swept, err = c.Sweep(ctx)
		for _, dir := range swept {
			p.log.Warn("removed a fork template a killed host agent left", "host", ph.name(), "dir", dir)
		}
		if err != nil {
			c.Close(agentCloseTimeout)
		}
	}
	if err != nil {
		p.mu.Lock()
		ph.agent = nil
		p.mu.Unlock()
		p.log.Warn("no host agent on the host: its desktops load golden states in place (install legato on it as "+hostagent.DefaultCommand+" on the SSH user's PATH, or name it with VM.HostAgent, --host-agent)",
			"host", ph.name(), "err", err)
		return
	}
	p.mu.Lock()
	ph.agent = c
	p.mu.Unlock()
	p.log.Info("host agent started: golden states fork on the host", "host", ph.name(), "pid", hello.PID, "fork_dir", hello.ForkDir)
}

// agentOf returns the host's agent; nil without one.
func (p *Pool) agentOf(ph *poolHost) *hostagent.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ph.agent
}

// closeAgent ends the host's agent session: the agent ends what is left.
func (p *Pool) closeAgent(ph *poolHost) {
	p.mu.Lock()
	a := ph.agent
	ph.agent = nil
	p.mu.Unlock()
	if a != nil {
		if err := a.Close(agentCloseTimeout); err != nil {
			p.log.Warn("closing the host agent", "host", ph.name(), "err", err)
		}
	}
}

// acquire reserves a slot on the host a new desktop goes to (pickHost),
// waiting while no host can take one, at most Config.HostWait.
func (p *Pool) acquire(ctx context.Context) (*poolHost, error) {
	timer := time.NewTimer(p.cfg.HostWait)
	defer timer.Stop()
	waited := false
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errors.New("desktop pool closed")
		}
		loads := make([]hostLoad, len(p.hosts))
		for i, ph := range p.hosts {
			loads[i] = hostLoad{up: !ph.down && !ph.leaving, cap: ph.cap, inUse: ph.inUse}
		}
		if i := pickHost(loads); i >= 0 {
			ph := p.hosts[i]
			ph.inUse++
			p.mu.Unlock()
			if waited {
				p.log.Info("a host has a free slot again", "host", ph.name())
			}
			return ph, nil
		}
		why := p.noSlotLocked()
		changed := p.changed
		p.mu.Unlock()
		if !waited {
			p.log.Warn("no host can take a new desktop; waiting for one", "hosts", why, "max", p.cfg.HostWait)
			waited = true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-timer.C:
			return nil, fmt.Errorf("no host could take a desktop for %v: %s", p.cfg.HostWait, why)
		}
	}
}

// noSlotLocked says, per host, why it takes no desktop now.
func (p *Pool) noSlotLocked() string {
	var parts []string
	for _, ph := range p.hosts {
		switch {
		case ph.leaving:
			parts = append(parts, fmt.Sprintf("%s leaving (gone from the DNS name; %d desktops finishing)", ph.name(), ph.inUse))
		case ph.down:
			parts = append(parts, fmt.Sprintf("%s down (%v; next try in %v)", ph.name(), ph.err, time.Until(ph.retryAt).Round(time.Second)))
		default:
			parts = append(parts, fmt.Sprintf("%s full (%d of %d)", ph.name(), ph.inUse, ph.cap))
		}
	}
	return strings.Join(parts, "; ")
}

// release gives a desktop's slot back.
func (p *Pool) release(ph *poolHost, vmName string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ph.inUse--
	delete(ph.vms, vmName)
	p.notifyLocked()
}

// hostDown marks a host down: it gets no new desktop until a probe finds
// it answering again. Its SSH connection is dropped, which fails every call
// still going through it, so its desktops fail at once rather than each
// waiting for a timeout.
func (p *Pool) hostDown(ph *poolHost, err error) {
	p.mu.Lock()
	if p.closed || ph.gone {
		p.mu.Unlock()
		return
	}
	first := !ph.down
	ph.down, ph.err = true, err
	ph.backoff = backoff.Policy{Base: hostRetryMin, Max: p.cfg.HostRetryMax}.Wait(ph.downs)
	ph.downs++
	ph.retryAt = time.Now().Add(ph.backoff)
	if ph.inUse > 0 {
		ph.unclean = true
	}
	inUse, retryIn := ph.inUse, ph.backoff
	p.notifyLocked()
	p.mu.Unlock()
	if first {
		p.log.Warn("host down: its desktops fail and it gets no new ones until it answers again",
			"host", ph.name(), "desktops", inUse, "err", err, "retry_in", retryIn)
	}
	ph.h.Drop()
}

// notifyLocked wakes those waiting for a host.
func (p *Pool) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// probeLoop tries the hosts that are down, each when its backoff passed,
// until the pool closes.
func (p *Pool) probeLoop() {
	defer p.probes.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stopProbes:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		gone := p.dropLeftLocked()
		var due []*poolHost
		for _, ph := range p.hosts {
			if ph.down && !ph.probing && !time.Now().Before(ph.retryAt) {
				ph.probing = true
				due = append(due, ph)
			}
		}
		p.mu.Unlock()
		p.closeLeft(gone)
		for _, ph := range due {
			p.probes.Add(1)
			go p.probe(ph)
		}
	}
}

// probe tries a host that is down, or that just joined: prepared (it
// answers, holds the image, and the VMs the batch lost there, or an
// earlier run left, are swept), it takes desktops.
func (p *Pool) probe(ph *poolHost) {
	defer p.probes.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(p.stopCtx, cancel)
	defer stop()
	p.mu.Lock()
	joined, firstTry := ph.joined, ph.joined && ph.downs == 0
	p.mu.Unlock()
	leftBy := "this batch while the host was down"
	if joined {
		leftBy = "an earlier run"
	}
	err := p.prepare(ctx, ph, leftBy)
	p.mu.Lock()
	ph.probing = false
	if err != nil || p.closed {
		p.mu.Unlock()
		if err != nil && p.stopCtx.Err() == nil {
			if firstTry {
				p.log.Warn("a host that joined could not be prepared: it is tried again with backoff", "host", ph.name(), "err", err)
			}
			p.log.Debug("host still down", "host", ph.name(), "err", err)
			p.hostDown(ph, err)
		}
		return
	}
	ph.down, ph.err, ph.downs, ph.backoff, ph.unclean, ph.joined = false, nil, 0, 0, false, false
	p.notifyLocked()
	p.mu.Unlock()
	if joined {
		p.log.Info("a host that joined is prepared: it takes desktops", "host", ph.name())
		return
	}
	p.log.Warn("host answers again: it takes desktops again", "host", ph.name())
}

// closeHosts stops the probes and closes the hosts' connections. Hosts
// that are down with desktops lost on them are reported: their VMs may
// still be there.
func (p *Pool) closeHosts() error {
	if p.stopProbes != nil {
		close(p.stopProbes)
		p.stopNow()
		p.probes.Wait()
		p.stopProbes = nil
	}
	if p.watch != nil {
		p.watch.Close()
	}
	var errs []error
	p.mu.Lock()
	for _, ph := range p.hosts {
		if ph.down && ph.unclean {
			errs = append(errs, fmt.Errorf("host %s is down (%v): VMs of this batch may be left there; run `legato rl gc --host %s --vm-prefix %s` once it answers",
				ph.name(), ph.err, ph.h.Spec().URI, p.cfg.VM.NamePrefix))
		}
	}
	hosts := p.hosts
	p.mu.Unlock()
	for _, ph := range hosts {
		p.closeAgent(ph)
		if ph.h != nil {
			ph.h.Close()
		}
	}
	return errors.Join(errs...)
}

// HostStatus is how one host of a pool stands.
type HostStatus struct {
	Name string
	// Desktops is the host's cap (0: none), InUse its desktops now.
	Desktops, InUse int
	// Down: the host does not answer; Err says why.
	Down bool
	Err  error
	// Leaving: the host left Config.HostsFrom's records; its desktops
	// finish their attempt.
	Leaving bool
}

// Hosts reports the pool's hosts (VM mode; nil for guests given by URL).
func (p *Pool) Hosts() []HostStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []HostStatus
	for _, ph := range p.hosts {
		out = append(out, HostStatus{Name: ph.name(), Desktops: ph.cap, InUse: ph.inUse, Down: ph.down, Err: ph.err, Leaving: ph.leaving})
	}
	return out
}

// hostFailure reports whether a desktop's start failed because its host
// did not answer (as opposed to the guest or the task).
func hostFailure(err error) bool {
	return errors.Is(err, vm.ErrLibvirtUnavailable)
}
