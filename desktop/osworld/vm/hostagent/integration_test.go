//go:build integration

package hostagent

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hosttest"
)

var imageDir = flag.String("vm.image", envOr("LEGATO_GUEST_IMAGE", "/var/tmp/legato-guest"), "directory with the test guest (base.qcow2, vmlinux, initrd.img, cmdline)")

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// buildLegato builds the legato binary the host's sshd runs as the agent.
func buildLegato(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "legato")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "legato/rl/cmd/legato")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build legato: %v: %s", err, out)
	}
	return bin
}

// guestAnswers polls the guest server behind port on the host's loopback
// (through its SSH connection) until it answers, at most two minutes, and
// returns how long that took.
func guestAnswers(t *testing.T, h *vm.Host, port int) time.Duration {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/platform", nil)
		resp, err := c.Do(req)
		rcancel()
		if err == nil {
			resp.Body.Close()
			return time.Since(t0)
		}
		if ctx.Err() != nil {
			t.Fatalf("the guest behind the host's port %d never answered: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clonesOn lists the QEMU processes of the template's clones (their
// -name starts with the template's): the namespace host shares this
// machine's processes.
func clonesOn(prefix string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "guest="+prefix) {
			pid, _ := strconv.Atoi(e.Name())
			pids = append(pids, pid)
		}
	}
	return pids
}

// A VM on a remote (namespace) host forks there through the host agent:
// the agent, started over the host's SSH connection from the binary this
// test builds, takes the template next to the VM; two clones forked
// through it serve their guests on the host's loopback, reached through
// SSH; the parked VM's ports lead to a clone; and when the fleet's side
// goes (its SSH connection dropped, as when the fleet is killed), the
// agent ends both clones and the template: no QEMU and no fork directory
// is left on the host.
func TestIntegrationHostAgentForks(t *testing.T) {
	for _, f := range []string{"base.qcow2", "vmlinux", "initrd.img", "cmdline"} {
		if _, err := os.Stat(filepath.Join(*imageDir, f)); err != nil {
			t.Fatalf("test guest incomplete (%v): build it with desktop/osworld/testdata/image/build.sh %s", err, *imageDir)
		}
	}
	cmdline, err := os.ReadFile(filepath.Join(*imageDir, "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	bin := buildLegato(t)
	fleet, err := hosttest.Start(t.Context(), hosttest.Options{Hosts: 1, Name: "lgagt", Net: 204, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Close(); err != nil {
			t.Errorf("remove the namespace host: %v", err)
		}
	})
	host := fleet.Hosts[0]
	forkDir := "/dev/shm/legato-itagent"
	t.Cleanup(func() { os.Remove(forkDir) })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := vm.Config{
		NamePrefix:  "legato-itagent-",
		BaseImage:   filepath.Join(*imageDir, "base.qcow2"),
		Kernel:      filepath.Join(*imageDir, "vmlinux"),
		Initrd:      filepath.Join(*imageDir, "initrd.img"),
		Cmdline:     strings.TrimSpace(string(cmdline)),
		VCPUs:       2,
		MemoryMiB:   1536,
		BootTimeout: 4 * time.Minute,
		Accel:       vm.AccelTCG,
		Fork:        true,
		ForkDir:     forkDir,
		Logger:      log,
		Hosts:       []vm.HostSpec{{URI: host.URI(), Desktops: 1, Name: host.Name}},
		SSH:         vm.SSHConfig{IdentityFiles: []string{fleet.KeyFile}, KnownHosts: []string{fleet.KnownHosts}, NoAgent: true},
	}
	ctx := t.Context()
	h, err := vm.OpenHost(cfg.Hosts[0], cfg, vm.HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.SyncImages(ctx, nil); err != nil {
		t.Fatal(err)
	}
	v, err := vm.StartOn(ctx, h, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()

	t0 := time.Now()
	agent, hello, err := Dial(ctx, h, Command(bin, forkDir, cfg.NamePrefix), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent pid %d on %s answered in %v", hello.PID, h.Name(), time.Since(t0))
	if swept, err := agent.Sweep(ctx); err != nil {
		t.Fatal(err)
	} else if len(swept) > 0 {
		t.Logf("swept leftovers of an earlier run: %v", swept)
	}
	t0 = time.Now()
	tmpl, err := agent.Template(ctx, v.DomainRef())
	if err != nil {
		t.Fatal(err)
	}
	tt := tmpl.Timings()
	t.Logf("remote template %s in %v: paused %v (state %v, %d KiB; ram %v, %d MiB written; disk %v)",
		tmpl.Name(), time.Since(t0), tt.Paused, tt.State, tt.StateBytes>>10, tt.RAM, tt.RAMBytes>>20, tt.Disk)
	if _, err := os.Stat(filepath.Join(forkDir, tmpl.Name(), "ram")); err != nil {
		t.Errorf("the template's RAM file is not on the host: %v", err)
	}
	// The VM runs on after the template.
	guestAnswers(t, h, v.Ports().Guest)

	var clones []*RemoteClone
	for i := range 2 {
		t0 := time.Now()
		c, err := tmpl.Fork(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fork := time.Since(t0)
		answered := guestAnswers(t, h, c.Ports().Guest)
		started, spare := c.Started()
		t.Logf("remote clone %d %s: fork call %v (on the host: QEMU started %v, prestarted %v, restore %v); guest answered through SSH %v later",
			i, c.Name(), fork, started, spare, c.Restore(), answered)
		clones = append(clones, c)
	}
	// A prestarted clone: the fork is only the state's load.
	if err := tmpl.Prestart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	c3, err := tmpl.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fork := time.Since(t0)
	started, spare := c3.Started()
	t.Logf("remote clone 2 %s: fork call %v (prestarted %v, QEMU started %v ahead, restore %v); guest answered through SSH %v later",
		c3.Name(), fork, spare, started, c3.Restore(), guestAnswers(t, h, c3.Ports().Guest))
	if err := c3.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c3.PID(), 0); err == nil {
		t.Errorf("clone %s (pid %d) runs after its Close", c3.Name(), c3.PID())
	}

	// The VM parks; the first clone takes its ports: the VM's address
	// reaches the clone's guest (the VM is paused).
	if err := agent.Reserve(ctx, v.Ports(), true); err != nil {
		t.Fatal(err)
	}
	if err := v.Park(ctx); err != nil {
		t.Fatal(err)
	}
	if err := clones[0].Forward(ctx, v.Ports()); err != nil {
		t.Fatal(err)
	}
	guestAnswers(t, h, v.Ports().Guest)

	// The fleet's side goes: its SSH connection drops (as when the fleet
	// is killed). The agent sees EOF and ends what it made.
	pids := clonesOn(tmpl.Name())
	if len(pids) != 2 {
		t.Errorf("clone processes on the host: %v, want the 2 left", pids)
	}
	h.Drop()
	select {
	case <-agent.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent's session did not end within 2 minutes of the dropped connection")
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := clonesOn(tmpl.Name())
		ents, _ := os.ReadDir(forkDir)
		if len(left) == 0 && len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the fleet's side went: clone processes %v, fork dir %v", left, ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after the fleet's side went: no clone process, fork dir %s empty", forkDir)
	if err := clones[1].Close(); err != nil {
		t.Errorf("closing a clone of an agent that went: %v", err)
	}
	agent.Close(time.Minute)
	// The VM takes its ports back and runs again, over a new connection.
	if err := v.Unpark(ctx); err != nil {
		t.Fatal(err)
	}
	guestAnswers(t, h, v.Ports().Guest)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
}
