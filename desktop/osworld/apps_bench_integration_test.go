//go:build integration

package osworld

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"legato/rl/desktop"
)

// TestIntegrationAppsBench measures, per program of the real-apps guest,
// what a trainer waits for between attempts and between steps, side by
// side on one VM: each reset kind to a settled first screen (setup
// included where the kind needs it), what a golden state costs on disk and
// in host RAM (a fork template's RAM file, a clone's own pages), and the
// wait after an action that changes nothing, by the executor's settle
// signal, by comparing screenshots, and OSWorld's fixed 3 s. Not in CI
// (about 21 minutes here):
//
//	LEGATO_APPS_BENCH=1 go test -tags integration -p 1 -run TestIntegrationAppsBench -v ./desktop/osworld/
func TestIntegrationAppsBench(t *testing.T) {
	if os.Getenv("LEGATO_APPS_BENCH") == "" {
		t.Skip("set LEGATO_APPS_BENCH=1 to run the real-apps benchmark")
	}
	const reps = 3
	cfg := appsConfig(t, "legato-itbench-")
	// One golden state and template at a time: a template of the 4 GiB
	// guest takes gigabytes of tmpfs.
	cfg.Golden.Fork, cfg.Golden.Max = true, 1
	cfg.VM.ForkDir = "/dev/shm/legato-itbench-fork"
	t.Cleanup(func() { os.Remove(cfg.VM.ForkDir) })
	ctx := t.Context()
	d, tasks := appsDesktop(t, cfg)

	// timeReset resets by the plan of one step of kind (planReset's own
	// plan when kind is "") and waits for the settled first screen.
	timeReset := func(t *testing.T, task desktop.Task, kind ResetKind) time.Duration {
		t.Helper()
		plan := planReset
		if kind != "" {
			// A golden state holds the setup; every other kind runs it.
			setup := kind != ResetGolden && kind != ResetGoldenFork
			plan = func(resetFacts) resetPlan {
				return resetPlan{steps: []resetStep{{kind: kind, why: "benchmark", setup: setup}}}
			}
		}
		start := time.Now()
		if err := d.reset(ctx, task, plan); err != nil {
			t.Fatalf("reset (%s): %v", kind, err)
		}
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if got := d.LastReset().Kind; kind != "" && got != kind {
			t.Fatalf("reset %s; want %s", got, kind)
		}
		return took
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2].Round(100 * time.Millisecond)
	}
	resets := func(t *testing.T, task desktop.Task, kind ResetKind) time.Duration {
		var ds []time.Duration
		for range reps {
			ds = append(ds, timeReset(t, task, kind))
		}
		return median(ds)
	}
	idleWait := func(t *testing.T, n int) (time.Duration, int) {
		t.Helper()
		var waits []time.Duration
		settled := 0
		for i := range n {
			start := time.Now()
			r := appsAct(t, d, idleMove(i))
			if r.Settled {
				settled++
			}
			waits = append(waits, time.Since(start))
		}
		return median(waits), settled
	}

	resetRows := []string{fmt.Sprintf("%-24s %12s %12s %12s %12s %12s %12s %12s",
		"task", "golden-build", "golden load", "fork", "fast+setup", "loadvm+setup", "revert+setup", "golden take")}
	costRows := []string{fmt.Sprintf("%-24s %14s %14s %14s %14s %14s",
		"task", "state disk MB", "template MB", "clone own MB", "clone RSS MB", "VM RSS MB")}
	waitRows := []string{fmt.Sprintf("%-24s %16s %16s %8s", "task", "act+settle sig.", "act+screenshots", "fixed 3s")}
	for _, task := range tasks {
		t.Run(task.ID, func(t *testing.T) {
			d.cfg.Ready.NoDamage = false
			build := timeReset(t, task, "")
			if kind := d.LastReset().Kind; kind != ResetGoldenBuild {
				t.Fatalf("first reset %s; want %s", kind, ResetGoldenBuild)
			}
			take := d.LastReset().Golden
			loads := resets(t, task, ResetGolden)
			size := goldenSize(t, d)
			vmRSS := procMemory(t, vmPID(t, d.VM().Name()))["Rss"]
			signal, sigSettled := idleWait(t, 5)
			d.cfg.Ready.NoDamage = true
			shots, shotSettled := idleWait(t, 5)
			d.cfg.Ready.NoDamage = false
			fasts := resets(t, task, ResetFast)
			loadvms := resets(t, task, ResetLoadvm)
			reverts := resets(t, task, ResetRevert)
			// Forks last: the next task's first reset brings the parked VM
			// back through its clean snapshot, as planReset plans it.
			forks := resets(t, task, ResetGoldenFork)
			d.golden.fork.mu.Lock()
			pid := d.golden.fork.clone.PID()
			d.golden.fork.mu.Unlock()
			clone := procMemory(t, pid)
			var template int64
			if ft, _ := d.golden.forks.acquire(d.golden.get(task.ID).key); ft != nil {
				template = ft.t.Timings().RAMBytes
				d.golden.forks.release(ft)
			}
			mb := func(n int64) string { return fmt.Sprintf("%.0f", float64(n)/1e6) }
			resetRows = append(resetRows, fmt.Sprintf("%-24s %12v %12v %12v %12v %12v %12v %12v",
				task.ID, build.Round(100*time.Millisecond), loads, forks, fasts, loadvms, reverts, take.Round(100*time.Millisecond)))
			costRows = append(costRows, fmt.Sprintf("%-24s %14s %14s %14s %14s %14s",
				task.ID, mb(size), mb(template), mb(clone["Anonymous"]), mb(clone["Rss"]), mb(vmRSS)))
			waitRows = append(waitRows, fmt.Sprintf("%-24s %9v (%d/5) %9v (%d/5) %8v",
				task.ID, signal.Round(10*time.Millisecond), sigSettled, shots.Round(10*time.Millisecond), shotSettled, 3*time.Second))
		})
	}
	t.Logf("real-apps guest, software emulation; resets to a settled first screen, medians of %d:\n%s", reps, strings.Join(resetRows, "\n"))
	t.Logf("what a golden state costs: its snapshot on disk, the fork template's RAM file (tmpfs), a clone's own pages (anonymous: the guest pages it wrote and QEMU's heap) and resident set, the VM's resident set:\n%s", strings.Join(costRows, "\n"))
	t.Logf("wait after an action that repaints nothing, medians of 5:\n%s", strings.Join(waitRows, "\n"))
}

// vmPID is the process id of the QEMU libvirt runs the VM in.
func vmPID(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", name+".pid"))
	if err != nil {
		t.Fatalf("the VM's QEMU: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("the VM's QEMU pid file: %v", err)
	}
	return pid
}

// procMemory reads a process's memory totals (/proc/PID/smaps_rollup), in
// bytes by field name.
func procMemory(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatalf("memory of process %d: %v", pid, err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				m[strings.TrimSuffix(f[0], ":")] = n << 10
			}
		}
	}
	if m["Rss"] == 0 {
		t.Fatalf("memory of process %d: no Rss in %q", pid, b)
	}
	return m
}

// goldenSize is the size of the VM state of the desktop's newest golden
// snapshot, as qemu-img lists it in the VM's overlay (its disk part is
// the overlay's clusters the snapshot keeps).
func goldenSize(t *testing.T, d *VMDesktop) int64 {
	t.Helper()
	out, err := exec.Command("qemu-img", "snapshot", "-U", "-l", d.VM().Overlay()).Output()
	if err != nil {
		t.Logf("qemu-img snapshot -l: %v", err)
		return 0
	}
	var size int64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[1], goldenPrefix) {
			continue
		}
		// ID TAG VM_SIZE(number unit) DATE TIME VM_CLOCK ...
		n, unit := f[2], ""
		if len(f) > 3 && (f[3] == "MiB" || f[3] == "GiB" || f[3] == "KiB" || f[3] == "B") {
			unit = f[3]
		}
		var v float64
		fmt.Sscanf(n, "%g", &v)
		switch unit {
		case "KiB":
			v *= 1 << 10
		case "MiB":
			v *= 1 << 20
		case "GiB":
			v *= 1 << 30
		}
		size = int64(v)
	}
	return size
}
