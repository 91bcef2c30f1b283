//go:build integration

package osworld

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hosttest"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestIntegrationGoldenForkRemote: a pool with --golden-fork on remote
// hosts starts the host agent on each over SSH; a group's first attempt
// takes the golden state and its template on the host, the later ones
// start in clones forked there (golden-fork). Then a batch on both hosts:
// the task whose template the first host holds starts there, every forked
// attempt runs on a host that holds its task's template, and each task
// forks. Closing the pool leaves no clone and no template on either host.
// Where podman runs, the hosts are containers of legato's Kubernetes host
// image, as pods (their own legato is the agent, their /dev/shm the
// DaemonSet's tmpfs); otherwise namespace hosts, and the agent the legato
// binary this test builds.
func TestIntegrationGoldenForkRemote(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-rfork-")
	cfg.Golden = GoldenConfig{Max: 2, Fork: true}
	cfg.VM.ForkDir = "/dev/shm/legato-itosw-rfork"
	cfg.VM.Accel = vm.AccelTCG // the hosts are this machine: no usable KVM
	opts := hosttest.Options{Hosts: 2, Name: "lgrfk", Net: 205}
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
	h, h1 := fleet.Hosts[0], fleet.Hosts[1]
	cfg.VM.Hosts = []vm.HostSpec{{URI: h.URI(), Desktops: 1, Name: h.Name}, {URI: h1.URI(), Desktops: 1, Name: h1.Name}}
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
	// The group below and the batch after it run on the same booted
	// desktops.
	kept := keepDesktops(t, pool)
	kd, err := kept.New(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	d0 := kd.(keptDesktop).VMDesktop
	d := d0.Desktop
	if got := d0.VM().Host().Name(); got != h.Name {
		t.Fatalf("slot 0's desktop is on %s, want %s", got, h.Name)
	}
	if d.golden.agent == nil {
		t.Fatal("the desktop on the remote host does not fork through its host agent")
	}
	// templates lists the fork dir on a host (a container's /dev/shm is
	// its own).
	templates := func(h *hosttest.Host) []string {
		t.Helper()
		out, err := h.Exec(context.Background(), "sh", "-c", `[ ! -e "$1" ] || ls -A "$1"`, "sh", cfg.VM.ForkDir)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(out))
	}
	goldenGroup(t, ctx, d, termEchoTask(t), 3, ResetGoldenFork, func() {
		if got := templates(h); len(got) != 1 {
			t.Errorf("fork templates on the host after the golden state was taken: %q; want one", got)
		}
	})
	clone := d.golden.fork.clone
	if clone == nil {
		t.Fatal("after forked attempts the desktop has no clone")
	}
	t.Logf("the last attempt ran in clone %s on %s", clone.Name(), h.Name)

	kd.Close() // back to kept, for the batch
	forkAffinityBatch(t, kept, h.Name)

	closed = true
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := append(templates(h), templates(h1)...)
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

// forkAffinityBatch runs a batch of two tasks, groups of 3, on the pool's
// two desktops, both up before it starts: kept's slot 0, on host0, which
// holds legato-term-echo's template, and one on host1, which holds none. Each
// host's first attempt follows the affinity: host0 forks term-echo, host1
// takes legato-notes-type (no host holds its template; host0 holds
// term-echo's). Later placement depends on timing, so from there it
// checks what must hold: term-echo never takes a golden state on host0
// again; every forked attempt runs on a host that took its task's
// template; and each task forks at least once.
func forkAffinityBatch(t *testing.T, kept *keptDesktops, host0 string) {
	t.Helper()
	tasks, err := rl.LoadTasks(filepath.Join("testdata", "tasks", "guest_tasks.json"), rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tasks = slices.DeleteFunc(tasks, func(tk desktop.Task) bool { return tk.ID != "legato-term-echo" && tk.ID != "legato-notes-type" })
	// Slot 1's desktop boots now, not while the batch runs (slot 0's
	// would have run it all by then).
	d1, err := kept.New(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	host1 := d1.(keptDesktop).VM().Host().Name()
	d1.Close()
	if host1 == host0 {
		t.Fatalf("slot 1's desktop is on %s too", host0)
	}
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: appsNoop})
	defer srv.Close()
	out := t.TempDir()
	sum, err := rl.Collect(t.Context(), tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-affinity"},
		rl.CollectOptions{Out: out, NewDesktop: kept.New, Desktops: 2, Group: 3, MaxSteps: 2, EnvRetries: -1, Logger: kept.p.Config().Logger})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if sum.State != schema.StateComplete || sum.GroupsClosed != len(tasks) {
		t.Fatalf("summary %+v; want every group closed", sum)
	}
	var recs []schema.Record
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(recs, func(a, b schema.Record) int { return a.StartedAt.Compare(b.StartedAt.Time) })
	// Where each task's template was taken: term-echo's on host0 before
	// the batch, the rest by the batch's golden-build attempts.
	held := map[string][]string{"legato-term-echo": {host0}}
	forked := map[string]int{}
	first := map[string]string{} // host → its first attempt's task and reset
	var table []string
	for _, r := range recs {
		if r.Status != schema.StatusOK || r.Env == nil {
			t.Fatalf("attempt %s/%d: status %s, env %+v; want ok with an env report", r.TaskID, r.Attempt, r.Status, r.Env)
		}
		host, kind := r.Env.Host, ResetKind(r.Env.Reset)
		table = append(table, fmt.Sprintf("%s/%d on %s: %s", r.TaskID, r.Attempt, host, kind))
		switch kind {
		case ResetGoldenBuild:
			if r.TaskID == "legato-term-echo" && host == host0 {
				t.Errorf("%s/%d took term-echo's golden state again on %s, which holds its template", r.TaskID, r.Attempt, host)
			}
			held[r.TaskID] = append(held[r.TaskID], host)
		case ResetGoldenFork:
			forked[r.TaskID]++
			if !slices.Contains(held[r.TaskID], host) {
				t.Errorf("%s/%d forked on %s; its template was taken on %v only", r.TaskID, r.Attempt, host, held[r.TaskID])
			}
		}
		if _, ok := first[host]; !ok {
			first[host] = r.TaskID + " " + string(kind)
		}
	}
	want := map[string]string{host0: "legato-term-echo " + string(ResetGoldenFork), host1: "legato-notes-type " + string(ResetGoldenBuild)}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("each host's first attempt (-want +got):\n%s", diff)
	}
	for _, tk := range tasks {
		if forked[tk.ID] == 0 {
			t.Errorf("no attempt of %s forked", tk.ID)
		}
	}
	t.Logf("where the batch's attempts ran:\n%s", strings.Join(table, "\n"))
}
