//go:build integration

package osworld

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
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
	"legato/rl/desktop/osworld/vm"
)

// termEchoTask is the test-guest task legato-term-echo, whose setup takes
// real time: it opens a terminal and waits for its window.
func termEchoTask(t *testing.T) desktop.Task {
	t.Helper()
	tasks, err := rl.LoadTasks(filepath.Join("testdata", "tasks", "guest_tasks.json"), rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range tasks {
		if x.ID == "legato-term-echo" {
			return x
		}
	}
	t.Fatal("no task legato-term-echo in testdata/tasks")
	return desktop.Task{}
}

// goldenSnapshots lists the VM's golden snapshots.
func goldenSnapshots(t *testing.T, ctx context.Context, v *vm.VM) []string {
	t.Helper()
	names, err := v.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var g []string
	for _, n := range names {
		if strings.HasPrefix(n, goldenPrefix) {
			g = append(g, n)
		}
	}
	return g
}

// goldenGroup runs a group of attempts of tk on d: the first takes the
// task's golden state, the others start from it (load is their reset
// kind). Every attempt's first screenshot is the same bytes, no attempt
// sees another's files, each draws its own random numbers and reads the
// host's time, and runs its actions through the state's executor.
func goldenGroup(t *testing.T, ctx context.Context, d *Desktop, tk desktop.Task, group int, load ResetKind, afterFirst func()) (first []byte) {
	t.Helper()
	sh := guestSh(t, d.Guest())
	var randoms []string
	var execDir string
	for i := range group {
		t0 := time.Now()
		if err := d.Reset(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		took := time.Since(t0)
		rep := d.LastReset()
		t.Logf("attempt %d: reset %s in %v to ready (restore %v, setup %v, golden %v): %s", i, rep.Kind, took.Round(time.Millisecond),
			rep.Restore.Round(time.Millisecond), rep.Setup.Round(time.Millisecond), rep.Golden.Round(time.Millisecond), rep.Why)
		want := load
		if i == 0 {
			want = ResetGoldenBuild
		}
		if rep.Kind != want {
			t.Fatalf("attempt %d: reset %s; want %s", i, rep.Kind, want)
		}
		if ar := d.AttemptReport(); ar.Reset != string(want) || ar.ResetWhy == "" {
			t.Errorf("attempt %d: attempt report says reset %q (%q); want %s with a reason", i, ar.Reset, ar.ResetWhy, want)
		}
		obs, err := d.Observe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = obs.Screenshot
			if afterFirst != nil {
				afterFirst()
			}
		} else if !bytes.Equal(obs.Screenshot, first) {
			out := filepath.Join(os.TempDir(), fmt.Sprintf("legato-golden-attempt-%d.png", i))
			os.WriteFile(out, obs.Screenshot, 0o644)
			os.WriteFile(filepath.Join(os.TempDir(), "legato-golden-attempt-0.png"), first, 0o644)
			t.Errorf("attempt %d: first screenshot (%d bytes) differs from attempt 0's (%d bytes); both in %s", i, len(obs.Screenshot), len(first), os.TempDir())
		}
		// Nothing any other attempt wrote is here; the setup's terminal is.
		if got := sh(`ls /home/user /tmp | grep -c legato-golden-; wmctrl -l | grep -c legato-term; true`); got != "0\n1" {
			t.Errorf("attempt %d: %q at its start; want no file of another attempt and the setup's one terminal", i, got)
		}
		randoms = append(randoms, sh(`head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'`))
		if i > 0 {
			off, err := d.sh.clockOffset(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if off.Abs() > time.Second {
				t.Errorf("attempt %d: guest clock %v off the host's after the golden load", i, off)
			}
		}
		// The attempt: a file in the home and in /tmp, and typing.
		sh(fmt.Sprintf(`echo %d > /home/user/legato-golden-%d.txt && echo %d > /tmp/legato-golden-%d.txt`, i, i, i, i))
		if r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: `pyautogui.typewrite('echo attempt > ~/out.txt\n')`}); err != nil || r.ExitCode != 0 {
			t.Fatalf("attempt %d: act: %v %+v", i, err, r)
		}
		// The executor that ran when the state was taken comes back with
		// it, and runs the attempt's actions.
		if i == 0 {
			execDir = d.exec.dir
		}
		if !d.exec.usable() || !d.exec.up || d.exec.dir != execDir {
			t.Errorf("attempt %d: the action did not run through the golden state's executor %s: %+v", i, execDir, d.exec)
		}
	}
	slices.Sort(randoms)
	if n := len(slices.Compact(slices.Clone(randoms))); n != group {
		t.Errorf("the %d attempts drew %d distinct random numbers: %q", group, n, randoms)
	}
	return first
}

// TestIntegrationGolden is the golden state's promise on a real guest: a
// group of 8 attempts of one task starts from one golden state (the first
// takes it, the others load it), every attempt's first screenshot is the
// same bytes, a file one attempt writes is in no other attempt nor in the
// golden state, every attempt draws its own random numbers and reads the
// host's time. A task whose setup changed takes its state again (never
// loads the old one); Golden.Max evicts; Close leaves nothing. With
// -osworld.measure it then times, on the same VM, a reset to a ready task
// each way: golden loadvm, clean loadvm + setup, fast reset + setup,
// libvirt revert + setup.
func TestIntegrationGolden(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-golden-")
	cfg.Golden = GoldenConfig{Max: 1}
	ctx := t.Context()
	tk := termEchoTask(t)
	vd := itDesktop(t, cfg)
	d, v := vd.Desktop, vd.VM()
	sh := guestSh(t, d.Guest())

	overlaySize := func() int64 {
		t.Helper()
		st, err := os.Stat(v.Overlay())
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	clean := overlaySize()

	const group = 8
	goldenGroup(t, ctx, d, tk, group, ResetGolden, func() {
		// What a golden state costs on disk (its memory and the setup's
		// writes), after the guest's page cache was dropped.
		t.Logf("overlay: %d MiB with the clean snapshot, %d MiB with the golden state", clean>>20, overlaySize()>>20)
	})
	snaps := goldenSnapshots(t, ctx, v)
	if len(snaps) != 1 {
		t.Errorf("golden snapshots after the group: %q; want one", snaps)
	}

	// The golden state itself holds no attempt's file: loaded once more,
	// before anything runs in it.
	if err := d.Reset(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if got := sh(`ls /home/user /tmp | grep -c legato-golden-; true`); got != "0" {
		t.Errorf("the golden state holds %s files the attempts wrote", got)
	}

	// The task's setup changed: the old state is out of date, taken again.
	changed := tk
	changed.Setup = append(slices.Clone(tk.Setup), desktop.SetupStep{Type: "execute", Parameters: json.RawMessage(`{"command":["sh","-c","echo changed > /home/user/changed.txt"]}`)})
	if err := d.Reset(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGoldenBuild || !strings.Contains(rep.Why, "out of date") {
		t.Errorf("after the task's setup changed: reset %s (%s); want %s, out of date", rep.Kind, rep.Why, ResetGoldenBuild)
	}
	if got := goldenSnapshots(t, ctx, v); len(got) != 1 || slices.Contains(got, snaps[0]) {
		t.Errorf("golden snapshots after the setup changed: %q; want one, not the old %q", got, snaps)
	}
	if err := d.Reset(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGolden {
		t.Errorf("second attempt of the changed task: reset %s (%s)", rep.Kind, rep.Why)
	}
	if got := sh(`cat /home/user/changed.txt`); got != "changed" {
		t.Errorf("changed task's golden state: changed.txt %q", got)
	}

	// Another task with Golden.Max 1: the first one's state is evicted.
	other := tk
	other.ID = "legato-term-echo-2"
	if err := d.Reset(ctx, other); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGoldenBuild {
		t.Errorf("another task: reset %s (%s)", rep.Kind, rep.Why)
	}
	if got := goldenSnapshots(t, ctx, v); len(got) != 1 {
		t.Errorf("golden snapshots with Golden.Max 1 after another task: %q; want one", got)
	}
	if d.golden.get(changed.ID) != nil {
		t.Errorf("task %s's state kept beyond Golden.Max", changed.ID)
	}

	if *itMeasure {
		measureGolden(t, ctx, d, tk, false)
	}

	name, overlay := v.Name(), v.Overlay()
	if err := vd.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("%s left behind after Close: %+v", name, left)
	}
	if _, err := os.Stat(overlay); !os.IsNotExist(err) {
		t.Errorf("overlay %s (the golden snapshots' home) after Close: %v", overlay, err)
	}
}

// measureGolden times, on one VM and one task, a reset to a ready first
// screen each way, with an attempt's dirt between: golden loadvm, clean
// loadvm + setup, fast reset + setup, libvirt revert + setup (each then
// waiting until the screen settled, which a golden state taken settled
// does not need).
func measureGolden(t *testing.T, ctx context.Context, d *Desktop, tk desktop.Task, fork bool) {
	n := *itReps
	res := map[ResetKind]*measurement{}
	m := func(k ResetKind) *measurement {
		if res[k] == nil {
			res[k] = &measurement{}
		}
		return res[k]
	}
	ready := func(kind ResetKind, t0 time.Time) {
		t.Helper()
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		m(kind + "_to_ready").add(time.Since(t0))
		rep := d.LastReset()
		m(kind + "_restore").add(rep.Restore)
		if rep.Setup > 0 {
			m(kind + "_setup").add(rep.Setup)
		}
	}
	forks := d.golden.forks
	viaReset := func(kind ResetKind, golden, noFast bool) {
		t.Helper()
		d.cfg.Golden.Off, d.cfg.NoFastReset = !golden, noFast
		// The pool decided the desktop forks: measuring the in-place
		// load takes that back for one reset.
		d.golden.forks = forks
		if kind == ResetGolden {
			d.golden.forks = nil
		}
		d.history.chooser = resetChooser{} // an unmeasured fast reset runs
		dirty(t, ctx, d)
		t0 := time.Now()
		if err := d.Reset(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if rep := d.LastReset(); rep.Kind != kind {
			t.Fatalf("measuring %s: reset %s (%s)", kind, rep.Kind, rep.Why)
		}
		ready(kind, t0)
		if kind == ResetGoldenFork {
			m(kind + "_clone_restore").add(d.golden.fork.clone.Restore())
			if started, spare := d.golden.fork.clone.Started(); spare {
				m(kind + "_clone_prestart").add(started)
			}
		}
	}
	// The group above left another task's state (Golden.Max 1).
	viaReset(ResetGoldenBuild, true, false)
	for range n {
		if fork {
			viaReset(ResetGoldenFork, true, false)
		}
		viaReset(ResetGolden, true, false)
		viaReset(ResetLoadvm, false, true)
		viaReset(ResetFast, false, false)
		// libvirt's revert (a new QEMU), as Reset falls back to it.
		d.cfg.Golden.Off = true
		dirty(t, ctx, d)
		t0 := time.Now()
		if err := d.restore(ctx, ResetRevert, d.vm.RevertLibvirt, newSeed()); err != nil {
			t.Fatal(err)
		}
		d.exec = executor{} // the clean snapshot holds none, as Reset knows
		d.history.fresh = false
		restore := time.Since(t0)
		if err := d.setup.Run(ctx, tk, tk.Setup); err != nil {
			t.Fatal(err)
		}
		d.setLastReset(ResetReport{TaskID: tk.ID, Kind: ResetRevert, Restore: restore, Setup: time.Since(t0) - restore})
		ready(ResetRevert, t0)
	}
	d.cfg.Golden.Off, d.cfg.NoFastReset, d.golden.forks = false, false, forks
	for _, k := range slices.Sorted(maps.Keys(res)) {
		t.Logf("golden measure %-24s %s", k, res[k])
	}
	if *itMeasureOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*itMeasureOut, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIntegrationGoldenFork is the fork path's promise on a real guest: a
// group of 8 attempts starts from one golden state, the first taking it,
// the other 7 each in a clone of its template (same first screen, no
// attempt's files in another, own entropy, the host's time), and a second
// desktop of the pool forks the same state without a setup. A task
// without a golden state then runs on the desktop's own VM again, whose
// clean snapshot brings it back; eviction removes the least recently used
// template; Close leaves no clone, template file or VM. With
// -osworld.measure it times each reset on the same VM, the fork included.
func TestIntegrationGoldenFork(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-fork-")
	cfg.Golden = GoldenConfig{Max: 1, Fork: true}
	cfg.VM.ForkDir = "/dev/shm/legato-itosw-fork"
	removeForkDir(t, cfg.VM.ForkDir)
	ctx := t.Context()
	tk := termEchoTask(t)
	pool, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	d0, err := pool.New(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	vd := d0.(*VMDesktop)
	d := vd.Desktop
	sh := guestSh(t, d.Guest())
	templates := func() []string {
		t.Helper()
		ents, err := os.ReadDir(cfg.VM.ForkDir)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}

	first := goldenGroup(t, ctx, d, tk, 8, ResetGoldenFork, func() {
		if got := templates(); len(got) != 1 {
			t.Errorf("fork templates after the golden state was taken: %q; want one", got)
		}
	})
	if !d.golden.fork.parked || d.golden.fork.clone == nil {
		t.Fatalf("after forked attempts: parked %v, clone %v; want the VM parked and a clone", d.golden.fork.parked, d.golden.fork.clone)
	}
	clonePID := d.golden.fork.clone.PID()

	// A second desktop of the pool forks the same state: no setup of its
	// own, the same first screen.
	d1, err := pool.New(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	other1 := d1.(*VMDesktop).Desktop
	if err := other1.Reset(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if err := other1.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	if rep := other1.LastReset(); rep.Kind != ResetGoldenFork || rep.Setup != 0 {
		t.Errorf("second desktop: reset %s with setup %v (%s); want %s of the first desktop's state", rep.Kind, rep.Setup, rep.Why, ResetGoldenFork)
	} else {
		t.Logf("second desktop: %s in %v: %s", rep.Kind, rep.Restore, rep.Why)
	}
	if obs, err := other1.Observe(ctx); err != nil {
		t.Fatal(err)
	} else if !bytes.Equal(obs.Screenshot, first) {
		t.Errorf("second desktop's first screenshot differs from the first desktop's (%d vs %d bytes)", len(obs.Screenshot), len(first))
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := templates(); len(got) != 1 {
		t.Errorf("fork templates after the second desktop closed: %q; want the pool's one", got)
	}

	// A task without a golden state runs on the VM again, from its clean
	// snapshot: nothing of the clones' attempts, nor of the attempt the VM
	// held before it parked (the golden build's, which wrote
	// legato-golden-0.txt).
	refused := tk
	refused.ID = "legato-term-echo-refused"
	d.cfg.Golden.Refuse = []string{refused.ID}
	if err := d.Reset(ctx, refused); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetLoadvm {
		t.Errorf("first reset on the VM after clones: %s (%s); want %s", rep.Kind, rep.Why, ResetLoadvm)
	}
	if d.golden.fork.parked || d.golden.fork.clone != nil {
		t.Errorf("after a reset on the VM: parked %v, clone %v", d.golden.fork.parked, d.golden.fork.clone)
	}
	if err := syscall.Kill(clonePID, 0); err == nil {
		t.Errorf("the last attempt's clone (pid %d) runs on", clonePID)
	}
	if got := sh(`ls /home/user /tmp | grep -c legato-golden-; true`); got != "0" {
		t.Errorf("the VM after clones holds %s files of earlier attempts", got)
	}
	// And back to a clone of the task.
	if err := d.Reset(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGoldenFork {
		t.Errorf("the task again: %s (%s); want %s", rep.Kind, rep.Why, ResetGoldenFork)
	}

	// Another task with Golden.Max 1: the first one's state goes, and its
	// template with it.
	before := templates()
	other := tk
	other.ID = "legato-term-echo-2"
	if err := d.Reset(ctx, other); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGoldenBuild {
		t.Errorf("another task: reset %s (%s)", rep.Kind, rep.Why)
	}
	if got := templates(); len(got) != 1 || slices.Equal(got, before) {
		t.Errorf("fork templates after eviction: %q (before: %q); want one, another", got, before)
	}

	// A template whose RAM file changed is never forked: the attempt
	// loads the desktop's own snapshot of the state in place, and the
	// template goes.
	if got := templates(); len(got) == 1 {
		ram := filepath.Join(cfg.VM.ForkDir, got[0], "ram")
		if err := os.Chtimes(ram, time.Time{}, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Reset(ctx, other); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetGolden || !strings.Contains(rep.Why, "fork failed") {
		t.Errorf("after the template's RAM file changed: reset %s (%s); want %s, fork failed", rep.Kind, rep.Why, ResetGolden)
	}
	if d.golden.fork.parked || d.golden.fork.clone != nil {
		t.Errorf("after a failed fork: parked %v, clone %v; want the VM running the attempt", d.golden.fork.parked, d.golden.fork.clone)
	}
	if got := sh(`wmctrl -l | grep -c legato-term; true`); got != "1" {
		t.Errorf("after the in-place load: %s terminals; want the setup's one", got)
	}
	if got := templates(); len(got) != 0 {
		t.Errorf("fork templates after a failed fork: %q; want none", got)
	}

	if *itMeasure {
		measureGolden(t, ctx, d, tk, true)
	}

	name := d.Name()
	if err := pool.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if got := templates(); len(got) != 0 {
		t.Errorf("fork templates after Close: %q", got)
	}
	if out, _ := exec.Command("pgrep", "-f", "guest="+cfg.VM.NamePrefix).Output(); len(out) > 0 {
		t.Errorf("QEMU processes of the prefix after Close: %s", out)
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("%s left behind after Close: %+v", name, left)
	}
}
