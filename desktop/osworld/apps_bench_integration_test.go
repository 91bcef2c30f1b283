//go:build integration

package osworld

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"legato/rl/desktop"
)

// TestIntegrationAppsBench measures, per program of the real-apps guest,
// what a trainer waits for between attempts and between steps, side by
// side on one VM: each reset kind to a settled first screen (setup
// included), the golden state's size, and the wait after an action that
// changes nothing, by the executor's settle signal, by comparing
// screenshots, and OSWorld's fixed 3 s. Not in CI (about 12 minutes here):
//
//	LEGATO_APPS_BENCH=1 go test -tags integration -p 1 -run TestIntegrationAppsBench -v ./desktop/osworld/
func TestIntegrationAppsBench(t *testing.T) {
	if os.Getenv("LEGATO_APPS_BENCH") == "" {
		t.Skip("set LEGATO_APPS_BENCH=1 to run the real-apps benchmark")
	}
	const reps = 3
	cfg := appsConfig(t, "legato-itbench-")
	ctx := t.Context()
	d, tasks := appsDesktop(t, cfg)

	// timeReset resets (by kind, unless "") and waits for the settled first
	// screen.
	timeReset := func(t *testing.T, task desktop.Task, kind ResetKind) (time.Duration, ResetKind) {
		t.Helper()
		if kind != "" {
			preferReset(d, kind)
		}
		start := time.Now()
		if err := d.Reset(ctx, task); err != nil {
			t.Fatalf("reset (%s): %v", kind, err)
		}
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Since(start), d.LastReset().Kind
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2].Round(100 * time.Millisecond)
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

	rows := []string{fmt.Sprintf("%-24s %12s %12s %12s %12s %12s %10s | %16s %16s %8s",
		"task", "golden-build", "golden load", "fast+setup", "loadvm+setup", "golden take", "state MB",
		"act+settle sig.", "act+screenshots", "fixed 3s")}
	for _, task := range tasks {
		t.Run(task.ID, func(t *testing.T) {
			d.cfg.Golden.Off, d.cfg.Ready.NoDamage = false, false
			build, kind := timeReset(t, task, "")
			if kind != ResetGoldenBuild {
				t.Fatalf("first reset %s; want %s", kind, ResetGoldenBuild)
			}
			take := d.LastReset().Golden
			var loads, fasts, loadvms []time.Duration
			for range reps {
				took, kind := timeReset(t, task, "")
				if kind != ResetGolden {
					t.Fatalf("reset %s; want %s", kind, ResetGolden)
				}
				loads = append(loads, took)
			}
			size := goldenSize(t, d)
			signal, sigSettled := idleWait(t, 5)
			d.cfg.Ready.NoDamage = true
			shots, shotSettled := idleWait(t, 5)
			d.cfg.Ready.NoDamage = false
			d.cfg.Golden.Off = true
			for range reps {
				took, kind := timeReset(t, task, ResetFast)
				if kind != ResetFast {
					t.Fatalf("reset %s; want %s", kind, ResetFast)
				}
				fasts = append(fasts, took)
			}
			for range reps {
				took, kind := timeReset(t, task, ResetLoadvm)
				if kind != ResetLoadvm {
					t.Fatalf("reset %s; want %s", kind, ResetLoadvm)
				}
				loadvms = append(loadvms, took)
			}
			d.cfg.Golden.Off = false
			rows = append(rows, fmt.Sprintf("%-24s %12v %12v %12v %12v %12v %10.0f | %9v (%d/5) %9v (%d/5) %8v",
				task.ID, build.Round(100*time.Millisecond), median(loads), median(fasts), median(loadvms),
				take.Round(100*time.Millisecond), float64(size)/1e6, signal.Round(10*time.Millisecond), sigSettled,
				shots.Round(10*time.Millisecond), shotSettled, 3*time.Second))
		})
	}
	t.Logf("real-apps guest, software emulation, medians of %d resets and 5 idle actions:\n%s", reps, strings.Join(rows, "\n"))
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
