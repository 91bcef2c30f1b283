//go:build integration

package osworld

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hosttest"
)

// TestIntegrationGoldenForkRemote: a pool with --golden-fork on a remote
// host starts the host agent there over SSH; a group's first attempt
// takes the golden state and its template on the host, the later ones
// start in clones forked there (golden-fork), and closing the pool leaves
// no clone and no template on the host. Where podman runs, the host is a
// container of legato's Kubernetes host image, as a pod (its own legato
// is the agent, its /dev/shm the DaemonSet's tmpfs); otherwise a
// namespace host, and the agent the legato binary this test builds.
func TestIntegrationGoldenForkRemote(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-rfork-")
	cfg.Golden = GoldenConfig{Max: 1, Fork: true}
	cfg.VM.ForkDir = "/dev/shm/legato-itosw-rfork"
	cfg.VM.Accel = vm.AccelTCG // the host is this machine: no usable KVM
	opts := hosttest.Options{Hosts: 1, Name: "lgrfk", Net: 205}
	if _, err := exec.LookPath("podman"); err == nil {
		opts.Image = hostImage(t)
	} else {
		bin := filepath.Join(t.TempDir(), "legato")
		if out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "legato/rl/cmd/legato").CombinedOutput(); err != nil {
			t.Fatalf("build legato: %v: %s", err, out)
		}
		cfg.VM.HostAgent = bin
	}
	fleet := startHosts(t, opts)
	h := fleet.Hosts[0]
	cfg.VM.Hosts = []vm.HostSpec{{URI: h.URI(), Desktops: 1, Name: h.Name}}
	t.Cleanup(func() { os.Remove(cfg.VM.ForkDir) })
	ctx := t.Context()
	pool, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			pool.Close()
		}
	})
	d0, err := pool.New(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := d0.(*VMDesktop).Desktop
	if d.golden.agent == nil {
		t.Fatal("the desktop on the remote host does not fork through its host agent")
	}
	// templates lists the fork dir on the host (a container's /dev/shm
	// is its own).
	templates := func() []string {
		t.Helper()
		out, err := h.Exec(context.Background(), "sh", "-c", `[ ! -e "$1" ] || ls -A "$1"`, "sh", cfg.VM.ForkDir)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(out))
	}
	goldenGroup(t, ctx, d, termEchoTask(t), 3, ResetGoldenFork, func() {
		if got := templates(); len(got) != 1 {
			t.Errorf("fork templates on the host after the golden state was taken: %q; want one", got)
		}
	})
	clone := d.golden.fork.clone
	if clone == nil {
		t.Fatal("after forked attempts the desktop has no clone")
	}
	t.Logf("the last attempt ran in clone %s on %s", clone.Name(), h.Name)
	closed = true
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := templates()
		out, _ := exec.Command("pgrep", "-f", "guest="+cfg.VM.NamePrefix+"fork-").Output()
		if len(left) == 0 && strings.TrimSpace(string(out)) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the pool closed: fork dir %q, clone processes %q", left, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
