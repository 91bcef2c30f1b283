//go:build integration

package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// cloneGuest is the guest client of a clone.
func cloneGuest(t *testing.T, c *Clone) *guest {
	return &guest{t: t, base: c.Ports().GuestURL(), http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
}

// waitAnswer polls the guest until it answers, and returns how long that
// took.
func (g *guest) waitAnswer(ctx context.Context) time.Duration {
	g.t.Helper()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, g.base+"/platform", nil)
		resp, err := g.http.Do(req)
		rcancel()
		if err == nil {
			resp.Body.Close()
			return time.Since(t0)
		}
		if ctx.Err() != nil {
			g.t.Fatalf("guest %s never answered: %v", g.base, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// screenshot fetches the guest's screen as PNG.
func (g *guest) screenshot(ctx context.Context) []byte {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.base+"/screenshot", nil)
	resp, err := g.http.Do(req)
	if err != nil {
		g.t.Fatalf("screenshot: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		g.t.Fatalf("screenshot: HTTP %d %v", resp.StatusCode, err)
	}
	return b
}

// privateKiB sums a process's private memory (what it alone holds) from
// /proc/PID/smaps_rollup, and its RSS.
func memOf(t *testing.T, pid int) (private, rss int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Private_Clean:", "Private_Dirty:":
			private += n
		case "Rss:":
			rss += n
		}
	}
	return private, rss
}

// diskKiB is what a file takes on its file system (tmpfs: memory).
func diskKiB(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks / 2
}

// TestIntegrationFork takes a template of a running VM and starts clones
// from it: each starts in the template's state (same boot, files,
// processes, screen), writes only its own copy, and leaves nothing behind.
func TestIntegrationFork(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := testConfig(t, "legato-itfork-")
	cfg.Fork = true
	cfg.ForkDir = "/dev/shm/legato-itfork"
	cfg.BootCache = itBootCache(t)
	t.Cleanup(func() { os.Remove(cfg.ForkDir) })
	// What the clones must not inherit.
	t.Setenv("LEGATO_POLICY_KEY", "sk-legato-itfork")
	sweepFirst(t, cfg)
	ctx := t.Context()
	v, err := Start(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	g := newGuest(t, v)
	g.dirty(ctx) // a file and a process the clones must have
	want := g.state(ctx)
	wantShot := g.screenshot(ctx)

	tmpl, err := v.Template(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	tt := tmpl.Timings()
	t.Logf("template: paused %v (state %v, %d B; ram %v, %d MiB written; disk %v)",
		tt.Paused, tt.State, tt.StateBytes, tt.RAM, tt.RAMBytes>>20, tt.Disk)
	if tt.StateBytes > 64<<20 {
		t.Errorf("device state is %d bytes: the guest RAM was sent, not left out", tt.StateBytes)
	}
	// The VM runs on after the template, and its own snapshots still hold
	// its RAM (x-ignore-shared is off again): a loadvm brings the clean
	// state back.
	if st := g.state(ctx); st != want {
		t.Fatalf("VM after the template: %+v, want %+v", st, want)
	}
	if err := v.RevertLoadvm(ctx); err != nil {
		t.Fatal(err)
	}
	if st := g.state(ctx); st.DirtyFile || st.DirtyProc || st.BootID != want.BootID {
		t.Fatalf("VM after loadvm of its clean snapshot: %+v", st)
	}

	// Two clones prestarted, two started by Fork: all four at once.
	if err := tmpl.Prestart(ctx, 2); err != nil {
		t.Fatal(err)
	}
	clones := make([]*Clone, 4)
	answer := make([]time.Duration, 4)
	var eg errgroup.Group
	for i := range clones {
		eg.Go(func() error {
			c, err := tmpl.Fork(ctx)
			if err != nil {
				return err
			}
			clones[i] = c
			answer[i] = cloneGuest(t, c).waitAnswer(ctx)
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	// A clone runs as QEMU's user: it gets none of this process's
	// environment (LEGATO_POLICY_KEY was set above), only its own.
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", clones[0].cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00"), cloneEnv(clones[0].dir); !slices.Equal(got, want) {
		t.Errorf("a clone's environment is %q; want only %q", got, want)
	}
	for i, c := range clones {
		started, spare := c.Started()
		t.Logf("clone %d: started %v (prestarted %v), restore %v, guest answered %v after", i, started, spare, c.Restore(), answer[i])
	}
	for i, c := range clones {
		cg := cloneGuest(t, c)
		if st := cg.state(ctx); st != want {
			t.Errorf("clone %d: state %+v, want the template's %+v", i, st, want)
		}
		if shot := cg.screenshot(ctx); !bytes.Equal(shot, wantShot) {
			t.Errorf("clone %d: first screenshot differs from the template's (%d vs %d bytes)", i, len(shot), len(wantShot))
		}
		cg.sh(ctx, fmt.Sprintf("echo %d > /home/user/clone-file && echo %d > /tmp/clone-file && sync", i, i))
	}
	for i, c := range clones {
		if got := cloneGuest(t, c).sh(ctx, "cat /home/user/clone-file /tmp/clone-file"); got != fmt.Sprintf("%d\n%d", i, i) {
			t.Errorf("clone %d reads %q: another clone's writes reached it", i, got)
		}
	}

	// Host memory: the four clones hold privately what they wrote; the
	// RAM they only read is the template's file, once.
	var private, rss int64
	for _, c := range clones {
		p, r := memOf(t, c.PID())
		private += p
		rss += r
	}
	vp, vrss := memOf(t, mustQEMU(t, v.Name()))
	ramFile := diskKiB(t, filepath.Join(tmpl.Dir(), "ram"))
	t.Logf("memory: 4 clones private %d MiB + template RAM file %d MiB = %d MiB (their RSS sum %d MiB); the template's VM: RSS %d MiB, private %d MiB",
		private>>10, ramFile>>10, (private+ramFile)>>10, rss>>10, vrss>>10, vp>>10)

	if *measure {
		measureIndependentVMs(t, ctx, len(clones), private+ramFile)
	}

	// A fifth clone after the others wrote: the template is unchanged.
	c5, err := tmpl.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g5 := cloneGuest(t, c5)
	g5.waitAnswer(ctx)
	if out, rc, _ := g5.try(ctx, "ls /home/user/clone-file /tmp/clone-file"); rc == 0 {
		t.Errorf("a new clone sees files other clones wrote: %q", out)
	}
	if err := tmpl.CheckRAM(ctx); err != nil {
		t.Error(err)
	}

	// The VM parks, and the clone takes its ports: the VM's callers reach
	// the clone; when the clone is gone, the VM takes them back.
	if err := v.Park(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c5.Forward(ctx, v.Ports()); err != nil {
		t.Fatal(err)
	}
	g.sh(ctx, "echo 5 > /tmp/clone-file")
	if got := g5.sh(ctx, "cat /tmp/clone-file"); got != "5" {
		t.Errorf("through the VM's port, a write reached %q, not the clone", got)
	}

	// Close: the clone's process and files go.
	pid := c5.PID()
	ports := []int{c5.Ports().Guest, c5.Ports().DevTools, c5.Ports().VLC}
	if err := c5.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("clone process %d still runs after Close", pid)
	}
	for _, p := range ports {
		if listening(t, p) {
			t.Errorf("port %d still listening after the clone closed", p)
		}
	}
	if err := v.Unpark(ctx); err != nil {
		t.Fatal(err)
	}
	if out, rc, _ := g.try(ctx, "cat /tmp/clone-file"); rc == 0 {
		t.Errorf("the unparked VM's port reaches a guest with the clone's file: %q", out)
	}
	// A RAM file changed behind the template's back is never forked:
	// a touch shows in its stat, a byte in its sum.
	ram := filepath.Join(tmpl.Dir(), "ram")
	st, err := os.Stat(ram)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(ram, time.Time{}, st.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if c, err := tmpl.Fork(ctx); err == nil {
		c.Close()
		t.Error("Fork took a RAM file touched since the template was taken")
	}
	f, err := os.OpenFile(ram, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0x5a}, 12345)
	f.Close()
	if err := tmpl.CheckRAM(ctx); err == nil {
		t.Error("CheckRAM passed a RAM file with a changed byte")
	}
	if err := tmpl.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range clones {
		if err := syscall.Kill(c.PID(), 0); err == nil {
			t.Errorf("clone %d (pid %d) runs after the template closed", i, c.PID())
		}
	}
	if ents, _ := os.ReadDir(cfg.ForkDir); len(ents) != 0 {
		t.Errorf("fork dir not empty after Close: %v", ents)
	}
}

// mustQEMU returns the pid of the domain's QEMU.
func mustQEMU(t *testing.T, name string) int {
	t.Helper()
	p, err := findQEMU(name)
	if err != nil {
		t.Fatal(err)
	}
	return p.pid
}

// A run killed with SIGKILL while it holds a template and a clone: the
// clone dies with it (parent-death signal), and SweepForks removes the
// template's files, which no process holds any more.
func TestIntegrationForkCrashThenSweep(t *testing.T) {
	cfg := testConfig(t, "legato-itforkcrash-")
	cfg.Fork = true
	cfg.ForkDir = "/dev/shm/legato-itforkcrash"
	cfg.BootCache = itBootCache(t)
	if os.Getenv(crashChildEnv) == "" {
		t.Cleanup(func() { os.Remove(cfg.ForkDir) })
	}
	if os.Getenv(crashChildEnv) != "" {
		ctx := context.Background()
		v, err := Start(ctx, cfg, 0)
		if err == nil {
			var tmpl *Template
			if tmpl, err = v.Template(ctx); err == nil {
				var c *Clone
				if c, err = tmpl.Fork(ctx); err == nil {
					fmt.Printf("FORKED %s %d %d\n", tmpl.Dir(), c.PID(), c.Ports().Guest)
					select {}
				}
			}
		}
		fmt.Printf("FAILED %v\n", err)
		os.Exit(1)
	}
	sweepFirst(t, cfg)
	if _, err := SweepForks(cfg.ForkDir, cfg.NamePrefix); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrationForkCrashThenSweep$", "-vm.image="+*imageDir)
	cmd.Env = append(os.Environ(), crashChildEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir string
	var pid, port int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "FORKED %s %d %d", &dir, &pid, &port); err == nil {
			break
		}
		if strings.HasPrefix(sc.Text(), "FAILED") {
			t.Log(sc.Text())
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	io.Copy(io.Discard, out)
	cmd.Wait()
	if dir == "" {
		t.Fatal("the child did not fork a clone")
	}
	// The clone's QEMU goes with its parent; give the kernel a moment.
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("clone %d outlived the killed run", pid)
	}
	left, err := ForkLeftovers(cfg.ForkDir, cfg.NamePrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Dir != dir {
		t.Fatalf("fork leftovers %+v, want the template %s", left, dir)
	}
	if _, err := SweepForks(cfg.ForkDir, cfg.NamePrefix); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("template dir after SweepForks: %v", err)
	}
	if _, err := Sweep(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	assertGone(t, cfg, []int{port})
}

// measureIndependentVMs boots n VMs side by side, each dirtied like the
// template's, and logs the host memory they hold against the clones'.
func measureIndependentVMs(t *testing.T, ctx context.Context, n int, clonesKiB int64) {
	cfg := testConfig(t, "legato-itforkvms-")
	sweepFirst(t, cfg)
	vms := make([]*VM, n)
	var eg errgroup.Group
	for i := range vms {
		eg.Go(func() error {
			v, err := Start(ctx, cfg, i)
			vms[i] = v
			return err
		})
	}
	err := eg.Wait()
	defer func() {
		for _, v := range vms {
			if v != nil {
				v.Close()
			}
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	var rss int64
	for _, v := range vms {
		newGuest(t, v).dirty(ctx)
		_, r := memOf(t, mustQEMU(t, v.Name()))
		rss += r
	}
	t.Logf("memory measure: %d independent VMs hold %d MiB (RSS); %d clones of one template %d MiB (private + the RAM file): %.2fx",
		n, rss>>10, n, clonesKiB>>10, float64(rss)/float64(clonesKiB))
}
