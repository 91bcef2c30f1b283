//go:build integration

package osworld

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/hostdns/dnstest"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hosttest"
	"legato/rl/export/profile"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// killingDesktop is a VM desktop that runs a hook once, the first time an
// action runs on it, while its attempt is in flight.
type killingDesktop struct {
	*VMDesktop
	once *sync.Once
	hook func()
}

func (k killingDesktop) Act(ctx context.Context, a desktop.Action) (desktop.ActResult, error) {
	k.once.Do(k.hook)
	return k.VMDesktop.Act(ctx, a)
}

// startHosts makes the namespace hosts of opts for a test; once the test
// and its deferred closes are done, it removes them and checks that no
// namespace of theirs is left.
func startHosts(t *testing.T, opts hosttest.Options) *hosttest.Fleet {
	t.Helper()
	opts.Logf = t.Logf
	fleet, err := hosttest.Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Close(); err != nil {
			t.Errorf("remove the namespace hosts: %v", err)
		}
		out, _ := exec.Command("ip", "netns", "list").Output()
		if strings.Contains(string(out), opts.Name) {
			t.Errorf("namespaces left: %s", out)
		}
	})
	return fleet
}

// TestIntegrationHostsAndReplicas runs a batch across 3 namespace hosts
// (one desktop each, reached over SSH only) and 2 scripted model replicas.
// Mid-batch one host is killed (its daemons and VMs, as a crash) while an
// attempt runs on it, and one replica is closed. Every group completes on
// the rest; the host comes back and gets a desktop again; summary.json and
// the profile break the batch down per host; and nothing is left on any
// host (no domain, no volume but the image's), nor a connection to one.
func TestIntegrationHostsAndReplicas(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	fleet := startHosts(t, hosttest.Options{Hosts: 3, Name: "lgosw", Net: 202})
	cfg := itConfig(t, "legato-ithosts-")
	// A copy of the image files of its own: the batch, and the check at
	// the end that every host holds them, must see one image even if the
	// shared test image is rebuilt meanwhile.
	img := t.TempDir()
	for _, p := range []*string{&cfg.VM.BaseImage, &cfg.VM.Kernel, &cfg.VM.Initrd} {
		b, err := os.ReadFile(*p)
		if err != nil {
			t.Fatal(err)
		}
		*p = filepath.Join(img, filepath.Base(*p))
		if err := os.WriteFile(*p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range fleet.Hosts {
		cfg.VM.Hosts = append(cfg.VM.Hosts, vm.HostSpec{URI: h.URI(), Desktops: 1, Name: h.Name})
	}
	cfg.VM.Accel = vm.AccelTCG // the hosts are this machine: no usable KVM
	// The kill is seen at once (the connection ends); keep-alives are for
	// a silent host, and three VMs on a small machine can keep an sshd
	// from answering for seconds.
	cfg.VM.SSH.KeepAlive, cfg.VM.SSH.KeepAliveCount = 5*time.Second, 3
	cfg.HostRetryMax = 5 * time.Second
	ctx := t.Context()
	tasks, err := rl.LoadTasks(filepath.Join("testdata", "tasks", "guest_tasks.json"), rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	p, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t.Logf("pool ready (images uploaded to 3 hosts) in %v", time.Since(t0).Round(time.Millisecond))
	if err := p.CheckTasks(tasks); err != nil {
		t.Fatal(err)
	}

	var srvs [2]*policytest.Server
	for i := range srvs {
		srvs[i] = policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
		defer srvs[i].Close()
	}
	replicaKilled := make(chan struct{})
	go func() {
		defer close(replicaKilled)
		for srvs[0].Stats().Requests < 6 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		t.Logf("closing replica 0 after %d requests", srvs[0].Stats().Requests)
		srvs[0].Close()
	}()

	// The first action on the second host kills that host; once the pool
	// has marked it down, its daemons start again.
	victim := fleet.Hosts[1]
	var killOnce sync.Once
	var killed atomic.Bool
	// backDesktops counts the desktops the pool gave the victim after the
	// kill: it gets desktops again once it answers, even when the batch
	// has no work left for them by then.
	var backDesktops atomic.Int32
	hostBack := make(chan error, 1)
	kill := func() {
		t.Logf("killing host %s mid-attempt", victim.Name)
		killed.Store(true)
		if err := victim.Kill(); err != nil {
			hostBack <- err
			return
		}
		go func() {
			deadline := time.Now().Add(2 * time.Minute)
			for !hostDown(p, victim.Name) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if !hostDown(p, victim.Name) {
				hostBack <- fmt.Errorf("the pool never marked %s down", victim.Name)
				return
			}
			t.Logf("pool marked %s down; starting its daemons again", victim.Name)
			hostBack <- victim.StartDaemons(context.WithoutCancel(ctx))
		}()
	}
	var ports []int
	var portsMu sync.Mutex
	factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := p.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		vd := d.(*VMDesktop)
		ps := vd.VM().Ports()
		portsMu.Lock()
		ports = append(ports, ps.Guest, ps.DevTools, ps.VLC)
		portsMu.Unlock()
		if vd.VM().Host().Name() == victim.Name {
			if killed.Load() {
				backDesktops.Add(1)
			}
			return killingDesktop{vd, &killOnce, kill}, nil
		}
		return vd, nil
	}

	out := t.TempDir()
	start := time.Now()
	sum, err := rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srvs[0].URL(), Replicas: []string{srvs[1].URL()},
		Model: "scripted", Version: "it-hosts", StepTimeout: 30 * time.Second}, rl.CollectOptions{
		Out:        out,
		NewDesktop: factory,
		Desktops:   3,
		Group:      2,
		MaxSteps:   4,
		EnvRetries: 2,
		Logger:     cfg.Logger,
	})
	took := time.Since(start)
	if err != nil {
		t.Errorf("Collect: %v", err)
	}
	<-replicaKilled
	select {
	case err := <-hostBack:
		if err != nil {
			t.Errorf("host %s: %v", victim.Name, err)
		}
	default:
		t.Errorf("host %s was never killed: no action ran on it", victim.Name)
	}
	if sum == nil {
		t.Fatal("no summary")
	}
	t.Logf("batch of %d tasks × 2 over 3 hosts and 2 replicas took %v (summary wall %.1fs); counts %v",
		len(tasks), took.Round(time.Second), sum.WallS, sum.Counts)
	if sum.State != schema.StateComplete || sum.GroupsClosed != len(tasks) {
		t.Errorf("state %q, %d of %d groups closed", sum.State, sum.GroupsClosed, len(tasks))
	}

	// Every attempt's final record is ok with the reward its task
	// deserves; the killed attempt was retried; each record names its
	// host and VM; each step names the replica that answered.
	final := map[string]schema.Record{}
	retriedOn := map[string]int{}
	served := map[string]int{}
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		if r.Env == nil || r.Env.Host == "" || r.Env.VM == "" {
			t.Errorf("record %s (%s) names no host or VM: %+v", r.RolloutID, r.Status, r.Env)
		}
		if r.Status == schema.StatusRetried {
			retriedOn[r.Env.Host]++
		} else {
			final[fmt.Sprintf("%s/%d", r.GroupID, r.Attempt)] = r
		}
		for _, s := range r.Steps {
			served[s.Model.Replica]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(final) != 2*len(tasks) {
		t.Errorf("%d final records, want %d", len(final), 2*len(tasks))
	}
	for k, r := range final {
		if r.Status != schema.StatusOK || r.Reward == nil || *r.Reward != 1 {
			msg := ""
			if r.Error != nil {
				msg = r.Error.Kind + ": " + r.Error.Message
			}
			t.Errorf("%s (%s) on %s: status %s, reward %v %s; want ok with reward 1", k, r.TaskID, r.Env.Host, r.Status, fmtReward(r.Reward), msg)
			for i, st := range r.Steps {
				for _, a := range st.Actions {
					t.Logf("  step %d: %q act %.2fs ready %.2fs wait %.2fs unsettled %v", i, a.Action, a.ActS, a.ReadyS, a.WaitS, a.Unsettled)
				}
			}
			t.Logf("  env %+v, timing %+v", r.Env, r.Timing)
		}
	}
	if retriedOn[victim.Name] == 0 {
		t.Errorf("no attempt was retried off the killed host %s (retried: %v)", victim.Name, retriedOn)
	}
	if served[srvs[0].URL()] == 0 || served[srvs[1].URL()] == 0 || served[""] != 0 {
		t.Errorf("steps by replica %v: want both replicas named and no step without one", served)
	}
	t.Logf("steps by replica: %v; retried by host: %v", served, retriedOn)

	// summary.json breaks the batch down per host: the killed host failed
	// an attempt; back again, it got a desktop.
	written, err := schema.ReadSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range fleet.Hosts {
		hs, ok := written.Hosts[h.Name]
		if !ok || hs.Attempts == 0 || hs.Desktops == 0 {
			t.Errorf("summary.json: host %s: %+v (present %v); want its desktops and attempts", h.Name, hs, ok)
		}
		t.Logf("host %s: %d desktops, %d tries, %d finished, %d failures, reset %.1fs model %.1fs act %.1fs eval %.1fs",
			h.Name, hs.Desktops, hs.Attempts, hs.Finished, hs.Failures, hs.PhaseS["reset_s"], hs.PhaseS["model_s"], hs.PhaseS["act_s"], hs.PhaseS["eval_s"])
	}
	if hs := written.Hosts[victim.Name]; hs.Failures == 0 {
		t.Errorf("killed host %s: %+v; want a failure", victim.Name, hs)
	}
	if backDesktops.Load() == 0 {
		t.Errorf("killed host %s got no desktop once it was back", victim.Name)
	}
	rep, err := profile.Build(out)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := profile.WriteText(&text, rep); err != nil {
		t.Fatal(err)
	}
	for _, h := range fleet.Hosts {
		if !strings.Contains(text.String(), "\n  "+h.Name+" ") {
			t.Errorf("profile lacks a row for host %s:\n%s", h.Name, text.String())
		}
	}

	// Nothing of the batch is left: no domain, no volume but the image's
	// on any host, no guest port here, no connection to a host.
	if err := p.Close(); err != nil {
		t.Errorf("close the pool: %v", err)
	}
	for _, h := range fleet.Hosts {
		doms, err := h.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "list", "--all", "--name")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(doms)); s != "" {
			t.Errorf("domains left on %s: %s", h.Name, s)
		}
		vols, err := h.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "vol-list", "--pool", vm.DefaultStoragePool)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(vols)), "\n") {
			if f := strings.Fields(line); len(f) > 0 && !slices.ContainsFunc([]string{"legato-base-", "legato-kernel-", "legato-initrd-"}, func(p string) bool { return strings.HasPrefix(f[0], p) }) {
				t.Errorf("volume left on %s: %s", h.Name, line)
			}
		}
	}
	portsMu.Lock()
	for _, port := range ports {
		if listening(t, port) {
			t.Errorf("guest port %d listens on this machine", port)
		}
	}
	portsMu.Unlock()
	if conns := hostConnections(t, "198.18.202."); len(conns) > 0 {
		t.Errorf("connections to the hosts left open:\n%s", strings.Join(conns, "\n"))
	}

	// legato rl hosts: every host answers, holds the image and runs no VM
	// of the prefix.
	var reports []vm.HostReport
	for _, spec := range cfg.VM.Hosts {
		h, err := vm.OpenHost(spec, cfg.VM, vm.HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, h.Inspect(ctx, cfg.VM.NamePrefix))
		h.Close()
	}
	var list bytes.Buffer
	if err := vm.WriteHostReports(&list, reports); err != nil {
		t.Fatal(err)
	}
	t.Logf("legato rl hosts:\n%s", list.String())
	for _, r := range reports {
		if !r.Ready() || r.Desktops != 1 || len(r.VMs) != 0 || len(r.Images) != 3 {
			t.Errorf("host %s: %+v; want it up, capped at 1, holding the 3 image files, without VMs", r.Name, r)
		}
	}
}

func hostDown(p *Pool, name string) bool {
	for _, h := range p.Hosts() {
		if h.Name == name {
			return h.Down
		}
	}
	return false
}

// hostConnections lists this process's TCP connections to addresses with
// the prefix.
func hostConnections(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ss", "-Htnp", "state", "established").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	me := fmt.Sprintf("pid=%d,", os.Getpid())
	var conns []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, me) && strings.Contains(line, prefix) {
			conns = append(conns, line)
		}
	}
	return conns
}

// TestIntegrationHostsFromDNS runs a batch on 2 namespace hosts found
// through a DNS name (a loopback DNS server naming their addresses, as a
// headless Service would): dnsBatch.
func TestIntegrationHostsFromDNS(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	if _, err := exec.LookPath("podman"); err == nil {
		// CI's budget: the same batch on the same hosttest fleet, with
		// the hosts' daemons from the image rather than this machine.
		t.Skip("TestIntegrationContainerHostsFromDNS runs dnsBatch on container hosts; this runs it on namespace hosts where podman is missing")
	}
	fleet := startHosts(t, hosttest.Options{Hosts: 2, Name: "lgdns", Net: 203})
	dnsBatch(t, fleet, dnstest.Start(t), "legato-itdns-")
}

// itHostsName is the DNS name the tests' hosts are found through.
const itHostsName = "legato-hosts.legato.it.test"

// dnsBatch runs a batch on the fleet's 2 hosts, found through itHostsName
// on dns. Mid-attempt the second host leaves the name: its desktop
// finishes that attempt, then is replaced on the first host, and the host
// gets no new desktop and is dropped. No record is an error (nor a retry),
// every group completes, and nothing is left on either host. It returns
// the batch's configuration (its pool closed).
func dnsBatch(t *testing.T, fleet *hosttest.Fleet, dns *dnstest.Server, prefix string) Config {
	t.Helper()
	const name = itHostsName
	stays, leaves := fleet.Hosts[0], fleet.Hosts[1]
	dns.SetA(name, stays.Addr, leaves.Addr)
	cfg := itConfig(t, prefix)
	cfg.HostsFrom = &hostdns.Source{Name: name, User: "root", Desktops: 2, KeyFile: fleet.KeyFile, KnownHosts: fleet.KnownHosts,
		Every: hostdns.MinEvery, Resolver: dns.Resolver()}
	cfg.VM.Accel = vm.AccelTCG // the hosts are this machine: no usable KVM
	ctx := t.Context()
	tasks, err := rl.LoadTasks(filepath.Join("testdata", "tasks", "guest_tasks.json"), rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// The first action on the leaving host takes it out of the name and
	// waits until the pool has seen it go: the attempt then goes on.
	var leaveOnce sync.Once
	var left atomic.Bool
	var leftErr atomic.Value
	leave := func() {
		t.Logf("removing %s from %s mid-attempt", leaves.Addr, name)
		dns.SetA(name, stays.Addr)
		deadline := time.Now().Add(time.Minute)
		for !hostLeaving(p, leaves.Addr) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if !hostLeaving(p, leaves.Addr) {
			leftErr.Store(fmt.Sprintf("the pool never saw %s leave", leaves.Addr))
		}
		left.Store(true)
	}
	var afterLeave sync.Map // host → desktops made there after the leave
	factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := p.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		vd := d.(*VMDesktop)
		host := vd.VM().Host().Name()
		if left.Load() {
			n, _ := afterLeave.LoadOrStore(host, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
		if host == leaves.Addr {
			return killingDesktop{vd, &leaveOnce, leave}, nil
		}
		return vd, nil
	}

	out := t.TempDir()
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
	defer srv.Close()
	sum, err := rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-dns", StepTimeout: 30 * time.Second},
		rl.CollectOptions{Out: out, NewDesktop: factory, Desktops: 2, Group: 2, MaxSteps: 4, EnvRetries: 2, Logger: cfg.Logger})
	if err != nil {
		t.Errorf("Collect: %v", err)
	}
	if msg := leftErr.Load(); msg != nil {
		t.Error(msg)
	}
	if !left.Load() {
		t.Fatalf("%s never left: no action ran on it", leaves.Addr)
	}
	if sum == nil || sum.State != schema.StateComplete || sum.GroupsClosed != len(tasks) {
		t.Fatalf("summary %+v; want every group closed", sum)
	}
	byHost := map[string]map[schema.Status]int{}
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		host := ""
		if r.Env != nil {
			host = r.Env.Host
		}
		if byHost[host] == nil {
			byHost[host] = map[schema.Status]int{}
		}
		byHost[host][r.Status]++
		if r.Status != schema.StatusOK {
			msg := ""
			if r.Error != nil {
				msg = r.Error.Kind + ": " + r.Error.Message
			}
			t.Errorf("record %s (%s a%d) on %q: %s %s; want ok", r.RolloutID, r.TaskID, r.Attempt, host, r.Status, msg)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("records by host: %v", byHost)
	if byHost[leaves.Addr][schema.StatusOK] == 0 {
		t.Errorf("no attempt finished on %s, the attempt it left during included", leaves.Addr)
	}
	if n, ok := afterLeave.Load(leaves.Addr); ok {
		t.Errorf("%s got %d desktops after it left", leaves.Addr, n.(*atomic.Int32).Load())
	}
	if _, ok := afterLeave.Load(stays.Addr); !ok {
		t.Errorf("the desktop of %s was not replaced on %s", leaves.Addr, stays.Addr)
	}
	deadline := time.Now().Add(time.Minute)
	for slices.ContainsFunc(p.Hosts(), func(h HostStatus) bool { return h.Name == leaves.Addr }) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if hs := p.Hosts(); len(hs) != 1 || hs[0].Name != stays.Addr {
		t.Errorf("hosts at the end %+v; want %s only, %s dropped", hs, stays.Addr, leaves.Addr)
	}
	if err := p.Close(); err != nil {
		t.Errorf("close the pool: %v", err)
	}
	for _, h := range fleet.Hosts {
		doms, err := h.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "list", "--all", "--name")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(doms)); s != "" {
			t.Errorf("domains left on %s: %s", h.Name, s)
		}
	}
	netPrefix := stays.Addr[:strings.LastIndexByte(stays.Addr, '.')+1]
	if conns := hostConnections(t, netPrefix); len(conns) > 0 {
		t.Errorf("connections to the hosts left open:\n%s", strings.Join(conns, "\n"))
	}
	return cfg
}

func hostLeaving(p *Pool, name string) bool {
	for _, h := range p.Hosts() {
		if h.Name == name {
			return h.Leaving
		}
	}
	return false
}
