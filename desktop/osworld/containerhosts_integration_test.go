//go:build integration

package osworld

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/osworld/hostdns/dnstest"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hosttest"
	"legato/rl/policy/policytest"
)

// podHostsEnv gives the crash child of TestIntegrationContainerHostsFromDNS
// its hosts: name=URI pairs, space-separated.
const podHostsEnv = "LEGATO_IT_POD_HOSTS"

// hostImage builds legato's host image (deploy/kubernetes/build-local.sh:
// podman, a base debootstrapped here; cached by a hash of its inputs) and
// returns its name.
func hostImage(t *testing.T) string {
	t.Helper()
	t0 := time.Now()
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join("..", "..", "deploy", "kubernetes", "build-local.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build the host image (as root, with podman, runc and debootstrap: apt-get install podman runc debootstrap): %v\n%s", err, stderr.String())
	}
	image := lastLine(string(out))
	t.Logf("host image %s in %v: %s", image, time.Since(t0).Round(time.Millisecond), lastLine(stderr.String()))
	return image
}

// TestIntegrationContainerHostsFromDNS runs dnsBatch on 2 hosts that are
// containers of legato's Kubernetes host image (built with podman here),
// each in a network namespace as a pod in its own, found through DNS; one
// leaves the name mid-batch without an error record. Each host's
// entrypoint logs its KVM verdict, its cap and the host key known_hosts
// holds. Then a collector on both hosts is killed (SIGKILL) mid-batch,
// one host is stopped as a drained pod (SIGTERM: its entrypoint destroys
// the VM) and started again, and legato rl gc's sweep through DNS removes
// what the collector left on both: no domain, no QEMU. After the test no
// container, QEMU, namespace or image mount of it is left.
func TestIntegrationContainerHostsFromDNS(t *testing.T) {
	const prefix = "legato-itpod-"
	if os.Getenv(crashChildEnv) != "" {
		podCrashChild(t, prefix)
		return
	}
	image := hostImage(t)
	ctx := t.Context()
	// Registered before the fleet: runs after its Close.
	var mounts []string
	t.Cleanup(func() {
		out, _ := exec.Command("podman", "ps", "--all", "--filter", "label=legato.hosttest.fleet=lgpod", "--format", "{{.Names}}").Output()
		if s := strings.TrimSpace(string(out)); s != "" {
			t.Errorf("containers left: %s", s)
		}
		procMounts, _ := os.ReadFile("/proc/mounts")
		for _, m := range mounts {
			if strings.Contains(string(procMounts), m) {
				t.Errorf("a container's root filesystem is still mounted at %s", m)
			}
		}
		if qemus := qemusOf(prefix); len(qemus) > 0 {
			t.Errorf("QEMUs of the test left: %v", qemus)
		}
	})
	t0 := time.Now()
	fleet := startHosts(t, hosttest.Options{Hosts: 2, Name: "lgpod", Net: 204, Image: image,
		// One desktop of itConfig's size, for the entrypoint's cap.
		ImageEnv: []string{"LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=1536"}})
	t.Logf("2 container hosts up in %v", time.Since(t0).Round(time.Millisecond))
	for _, h := range fleet.Hosts {
		name := "legato-hosttest-" + h.Name
		if out, err := exec.Command("podman", "inspect", "--format", "{{.GraphDriver.Data.MergedDir}}", name).Output(); err == nil && len(out) > 1 {
			mounts = append(mounts, strings.TrimSpace(string(out)))
		}
		log, err := h.Log(ctx)
		if err != nil {
			t.Fatal(err)
		}
		key, err := h.HostKey()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s's entrypoint:\n%s", h.Name, entrypointLines(log))
		for _, want := range []string{"legato-host: " + kvmVerdictPrefix(log), "legato-host: host cap: ", "2 cpus, 1536 MiB each)",
			"legato-host: host key: " + key, "legato-host: storage pool legato at /var/lib/legato/pool",
			"legato-host: ready: qemu+ssh://root@" + h.Addr + "/system"} {
			if !strings.Contains(log, want) {
				t.Errorf("%s's log does not say %q", h.Name, want)
			}
		}
	}

	dns := dnstest.Start(t)
	t1 := time.Now()
	cfg := dnsBatch(t, fleet, dns, prefix)
	t.Logf("the batch through DNS took %v", time.Since(t1).Round(time.Second))
	if t.Failed() {
		return
	}

	// A collector on both hosts, killed mid-batch: its VMs stay.
	t2 := time.Now()
	started := podCrash(t, fleet, prefix)
	t.Logf("collector killed with VMs %v booting, after %v", started, time.Since(t2).Round(time.Second))

	// The second host stops as a drained pod: its entrypoint destroys the
	// VM on SIGTERM. Started again, its pool still holds the VM's volumes.
	drained := fleet.Hosts[1]
	if err := drained.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	log, err := drained.Log(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s's entrypoint on SIGTERM:\n%s", drained.Name, entrypointLines(log[max(0, strings.LastIndex(log, "legato-host: ready")):]))
	for _, want := range []string{"legato-host: stopping (signal)", "legato-host: destroyed " + started[drained.Addr]} {
		if !strings.Contains(log, want) {
			t.Errorf("%s's log does not say %q", drained.Name, want)
		}
	}
	if err := drained.StartDaemons(ctx); err != nil {
		t.Fatal(err)
	}

	// legato rl gc --hosts-from dns:...: both hosts in the name again.
	dns.SetA(itHostsName, fleet.Hosts[0].Addr, drained.Addr)
	var gcOut strings.Builder
	if err := GC(ctx, cfg, &gcOut); err != nil {
		t.Fatal(err)
	}
	t.Logf("gc:\n%s", gcOut.String())
	for addr, name := range started {
		if !strings.Contains(gcOut.String(), "removed "+name+" on "+addr+" (") {
			t.Errorf("gc did not remove %s on %s", name, addr)
		}
	}
	if strings.Contains(gcOut.String(), "NOT removed") {
		t.Errorf("gc left VMs")
	}
	gcOut.Reset()
	if err := GC(ctx, cfg, &gcOut); err != nil || gcOut.String() != "no leftover VMs\n" {
		t.Errorf("second gc: %q, %v; want nothing left", gcOut.String(), err)
	}
	for _, h := range fleet.Hosts {
		doms, err := h.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "list", "--all", "--name")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(doms)); s != "" {
			t.Errorf("domains left on %s after gc: %s", h.Name, s)
		}
	}
	if qemus := qemusOf(prefix); len(qemus) > 0 {
		t.Errorf("QEMUs left after gc: %v", qemus)
	}
}

// kvmVerdictPrefix is the start of the entrypoint's KVM line it printed:
// with KVM or without (this machine's verdict is not the test's to fix).
func kvmVerdictPrefix(log string) string {
	if strings.Contains(log, "legato-host: KVM: /dev/kvm usable") {
		return "KVM: /dev/kvm usable"
	}
	return "no usable /dev/kvm: guests run under TCG"
}

// entrypointLines are the entrypoint's own lines of a container's log.
func entrypointLines(log string) string {
	var lines []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.HasPrefix(line, "legato-host: ") {
			lines = append(lines, "  "+line)
		}
	}
	return strings.Join(lines, "\n")
}

// qemusOf lists the QEMU processes on this machine of VMs with the prefix.
func qemusOf(prefix string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.Contains(filepath.Base(args[0]), "qemu-system") && slices.ContainsFunc(args, func(a string) bool {
			return strings.Contains(a, "guest="+prefix)
		}) {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			pids = append(pids, pid)
		}
	}
	return pids
}

// podCrash runs podCrashChild on the fleet's hosts and kills it (SIGKILL)
// once a VM of prefix runs on each host (booting: the batch's first
// resets), and returns those VMs, by host address.
func podCrash(t *testing.T, fleet *hosttest.Fleet, prefix string) map[string]string {
	t.Helper()
	var hosts []string
	for _, h := range fleet.Hosts {
		hosts = append(hosts, h.Addr+"="+h.URI())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrationContainerHostsFromDNS$", "-osworld.image="+*itImage)
	cmd.Env = append(os.Environ(), crashChildEnv+"=1", podHostsEnv+"="+strings.Join(hosts, " "))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // a killed test leaves no collector
	exited := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}()
	started := map[string]string{}
	for deadline := time.Now().Add(5 * time.Minute); len(started) < len(fleet.Hosts); {
		for _, h := range fleet.Hosts {
			out, _ := h.Exec(t.Context(), "virsh", "-q", "-c", "qemu:///system", "list", "--name")
			for _, name := range strings.Fields(string(out)) {
				if strings.HasPrefix(name, prefix) {
					started[h.Addr] = name
				}
			}
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the collector ended (%v) before it had a VM on each host (%v)", err, started)
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector had no VM on each host in 5 minutes: %v", started)
		}
	}
	return started
}

// podCrashChild is the collector that gets killed: one desktop on each
// host of podHostsEnv, an agent that waits.
func podCrashChild(t *testing.T, prefix string) {
	cfg := itConfig(t, prefix)
	cfg.VM.Accel = vm.AccelTCG
	for _, pair := range strings.Fields(os.Getenv(podHostsEnv)) {
		name, uri, _ := strings.Cut(pair, "=")
		cfg.VM.Hosts = append(cfg.VM.Hosts, vm.HostSpec{Name: name, URI: uri, Desktops: 1})
	}
	ctx := t.Context()
	p, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: func(req policytest.Request) string {
		return "Action: wait.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"wait\", \"time\": 1}}\n</tool_call>"
	}})
	var tasks []desktop.Task
	for i := range 2 {
		tasks = append(tasks, desktop.Task{ID: fmt.Sprintf("forever-%d", i), Domain: "legato_term", Instruction: "Wait.",
			Evaluator: json.RawMessage(`{"func":"infeasible"}`)})
	}
	_, err = rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "crash"}, rl.CollectOptions{
		Out: t.TempDir(), NewDesktop: p.New, Desktops: 2, Group: 1, MaxSteps: 1000, // killed long before
	})
	t.Fatalf("the batch ended (%v); it should have been killed", err)
}
