//go:build integration

// Integration tests on real libvirt/QEMU VMs running legato's Debian test
// guest. They need the libvirt daemons (.ci/libvirt-up.sh), run as root,
// and build the guest image themselves (cached):
//
//	go test -race -tags integration -run Integration ./desktop/osworld/ [-osworld.image DIR] [-osworld.measure]
package osworld

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var (
	itImage      = flag.String("osworld.image", envOr("LEGATO_GUEST_IMAGE", "/var/tmp/legato-guest"), "directory of the test guest image, built there by testdata/image/build.sh if needed")
	itMeasure    = flag.Bool("osworld.measure", false, "also measure reset times, waits and guest call latencies (minutes under software emulation)")
	itReps       = flag.Int("osworld.reps", 5, "repetitions per measurement with -osworld.measure")
	itMeasureOut = flag.String("osworld.measure.out", "", "write the -osworld.measure results as JSON to this file")
)

const crashChildEnv = "LEGATO_OSWORLD_CRASH_CHILD"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

var (
	imageOnce sync.Once
	imageErr  error
)

// ensureImage builds the test guest image unless it is up to date (the
// build script keeps a stamp of its inputs).
func ensureImage(t *testing.T) {
	t.Helper()
	imageOnce.Do(func() {
		cmd := exec.Command("bash", filepath.Join("testdata", "image", "build.sh"), *itImage)
		out, err := cmd.CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("build the test guest image (run .ci/libvirt-up.sh first, as root): %v\n%s", err, out)
			return
		}
		t.Logf("test guest image: %s", strings.TrimSpace(lastLine(string(out))))
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// itBootCacheEnv hands the boot cache to the crash children.
const itBootCacheEnv = "LEGATO_OSWORLD_IT_BOOT_CACHE"

var itBootCacheOnce = sync.OnceValues(func() (string, error) {
	if dir := os.Getenv(itBootCacheEnv); dir != "" {
		return dir, nil // a crash child's: its parent removes it
	}
	dir, err := os.MkdirTemp("", "legato-it-bootcache-")
	if err != nil {
		return "", err
	}
	atExit = append(atExit, func() { os.RemoveAll(dir) })
	return dir, os.Setenv(itBootCacheEnv, dir)
})

// itBootCache is the boot cache (vm.Config.BootCache) of every test VM of
// the run, crash children's too: the first VM of a machine and clean-state
// configuration boots, the later ones start from its clean state. The
// tests of the boot itself are in package vm.
func itBootCache(t *testing.T) string {
	t.Helper()
	dir, err := itBootCacheOnce()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// removeForkDir removes the fork directory dir, which a test named, when
// the test ends. Call it before making the test's desktops: its cleanup
// then runs after theirs, when their templates and clones must have taken
// their files with them (a file left is an error).
func removeForkDir(t *testing.T, dir string) {
	t.Helper()
	t.Cleanup(func() {
		left, err := os.ReadDir(dir)
		if err == nil && len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("the fork directory %s keeps %v after every desktop closed", dir, names)
			return
		}
		os.Remove(dir)
	})
}

// itConfig is a desktop configuration for the test guest: two or three
// small VMs fit a 2-core CI machine.
func itConfig(t *testing.T, prefix string) Config {
	t.Helper()
	ensureImage(t)
	cmdline, err := os.ReadFile(filepath.Join(*itImage, "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		VM: vm.Config{
			NamePrefix: prefix,
			BaseImage:  filepath.Join(*itImage, "base.qcow2"),
			Kernel:     filepath.Join(*itImage, "vmlinux"),
			Initrd:     filepath.Join(*itImage, "initrd.img"),
			Cmdline:    strings.TrimSpace(string(cmdline)),
			VCPUs:      2,
			MemoryMiB:  1536,
			BootCache:  itBootCache(t),
		},
		BootTimeout: 4 * time.Minute,
		CacheDir:    t.TempDir(),
		Grade:       GradeConfig{Mode: grade.NativeOnly},
		// The tests of the resets without golden states; the golden
		// tests turn them on.
		Golden: GoldenConfig{Off: true},
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// itDesktop makes a pool of cfg and its first VM desktop; the pool closes
// when the test ends.
func itDesktop(t *testing.T, cfg Config) *VMDesktop {
	t.Helper()
	p, err := NewPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	d, err := p.New(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.(*VMDesktop)
}

// guestSh returns a function that runs a shell line in the guest as its
// user, fails the test unless it exits 0, and returns its trimmed output.
func guestSh(t *testing.T, c *guest.Client) func(cmd string) string {
	return func(cmd string) string {
		t.Helper()
		res, err := c.Execute(t.Context(), guest.ShellLine(cmd))
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("guest %q: %v %+v", cmd, err, res)
		}
		return strings.TrimSpace(res.Output)
	}
}

// guestScript plays the agent for the tasks of testdata/tasks: it types
// what each task asks for into the terminal the task's setup opened, then
// ends the attempt.
func guestScript(req policytest.Request) string {
	typ := func(text string) string {
		b, _ := json.Marshal(map[string]any{"action": "type", "text": text})
		return string(b)
	}
	done := `{"action": "terminate", "status": "success"}`
	var plan []string
	switch in := req.Instruction; {
	case strings.Contains(in, "hello legato"):
		plan = []string{typ("echo hello legato > ~/out.txt\n"), done}
	case strings.Contains(in, "word os"):
		plan = []string{typ("echo os > ~/os.txt\n"), done}
	case strings.Contains(in, "legato typed this"):
		plan = []string{typ("legato typed this\n"), done}
	case strings.Contains(in, "colours"):
		plan = []string{`{"action": "terminate", "status": "failure"}`}
	default:
		plan = []string{done}
	}
	return planCall(req.Step, plan)
}

// planCall is the scripted model's reply at step: the step's computer_use
// call of plan, and a successful terminate once plan is done.
func planCall(step int, plan []string) string {
	call := `{"action": "terminate", "status": "success"}`
	if step < len(plan) {
		call = plan[step]
	}
	return fmt.Sprintf("Action: step %d.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": %s}\n</tool_call>", step, call)
}

// keptDesktops hands a test's batches (Collect, Replay, ProbeTasks) the
// same booted desktops, slot for slot: a batch's Close gives its desktop
// back for the next batch, and the test's end closes them all. What those
// tests check happens between a reset and a grade, which every attempt
// does anyway; a boot per batch checks nothing more and costs 20–60 s
// under software emulation. Batches using it must run one after another.
type keptDesktops struct {
	p    *Pool
	mu   sync.Mutex
	idle map[int]*VMDesktop
	all  []*VMDesktop
}

func keepDesktops(t *testing.T, p *Pool) *keptDesktops {
	k := &keptDesktops{p: p, idle: map[int]*VMDesktop{}}
	t.Cleanup(func() {
		for _, d := range k.all {
			d.Close()
		}
	})
	return k
}

// New is a desktop.Factory: slot's kept desktop, or a new one.
func (k *keptDesktops) New(ctx context.Context, slot int) (desktop.Desktop, error) {
	k.mu.Lock()
	d, ok := k.idle[slot]
	delete(k.idle, slot)
	k.mu.Unlock()
	if !ok {
		nd, err := k.p.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		d = nd.(*VMDesktop)
		k.mu.Lock()
		k.all = append(k.all, d)
		k.mu.Unlock()
	}
	return keptDesktop{d, k, slot}, nil
}

type keptDesktop struct {
	*VMDesktop
	k    *keptDesktops
	slot int
}

// Close gives the desktop back for the test's next batch.
func (d keptDesktop) Close() error {
	d.k.mu.Lock()
	defer d.k.mu.Unlock()
	d.k.idle[d.slot] = d.VMDesktop
	return nil
}

// itPool makes the pool of cfg, closed when the test ends, and loads the
// tasks of file, checked against it.
func itPool(t *testing.T, cfg Config, file string) (*Pool, []desktop.Task) {
	t.Helper()
	tasks, err := rl.LoadTasks(file, rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.CheckTasks(tasks); err != nil {
		t.Fatal(err)
	}
	return p, tasks
}

// resetLog records, per task, the kind of each Reset of a batch.
type resetLog struct {
	mu    sync.Mutex
	kinds map[string][]ResetReport
	ports []int
}

// recordingDesktop is a VM desktop that reports its resets to a resetLog.
type recordingDesktop struct {
	*VMDesktop
	log *resetLog
}

func (r recordingDesktop) Reset(ctx context.Context, task desktop.Task) error {
	err := r.VMDesktop.Reset(ctx, task)
	if err == nil {
		r.log.mu.Lock()
		r.log.kinds[task.ID] = append(r.log.kinds[task.ID], r.LastReset())
		r.log.mu.Unlock()
	}
	return err
}

// wideListeners returns the TCP listeners of QEMU processes that are not
// on 127.0.0.1.
func wideListeners(t *testing.T) []string {
	out, err := exec.Command("ss", "-Hltnp").Output()
	if err != nil {
		t.Errorf("ss -ltnp: %v", err)
		return nil
	}
	var wide []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && strings.Contains(line, "qemu-system") && !strings.HasPrefix(f[3], "127.0.0.1:") {
			wide = append(wide, line)
		}
	}
	return wide
}

func listening(t *testing.T, port int) bool {
	out, err := exec.Command("ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	return strings.TrimSpace(string(out)) != ""
}

// TestIntegrationCollect runs a batch of the test-guest tasks with
// rl.Collect on two VMs and the scripted model server: every attempt ends
// ok with the reward its task deserves, the os task is reverted and the
// others fast-reset, nothing listens beyond loopback, and no VM remains.
func TestIntegrationCollect(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-collect-")
	ctx := t.Context()
	p, tasks := itPool(t, cfg, filepath.Join("testdata", "tasks", "guest_tasks.json"))
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: guestScript})
	defer srv.Close()

	resets := &resetLog{kinds: map[string][]ResetReport{}}
	factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := p.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		vd := d.(*VMDesktop)
		ps := vd.VM().Ports()
		resets.mu.Lock()
		resets.ports = append(resets.ports, ps.Guest, ps.DevTools, ps.VLC)
		resets.mu.Unlock()
		return recordingDesktop{vd, resets}, nil
	}
	var wide []string
	out := t.TempDir()
	start := time.Now()
	sum, err := rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-1"}, rl.CollectOptions{
		Out:        out,
		NewDesktop: factory,
		Desktops:   2,
		Group:      2,
		MaxSteps:   4,
		EnvRetries: -1, // a desktop failure must show, not be retried away
		Logger:     cfg.Logger,
		OnGroup: func(rl.Group) {
			if w := wideListeners(t); len(w) > 0 {
				wide = append(wide, w...)
			}
		},
	})
	if err != nil {
		t.Errorf("Collect: %v", err)
	}
	if sum != nil {
		t.Logf("batch of %d tasks took %v; counts: %+v; phase share: %v", len(tasks), time.Since(start).Round(time.Second), sum.Counts, sum.PhaseShare)
	}
	if len(wide) > 0 {
		t.Errorf("QEMU listened beyond 127.0.0.1 during the batch:\n%s", strings.Join(wide, "\n"))
	}

	// Every desktop is gone once the pool is closed.
	if err := p.Close(); err != nil {
		t.Errorf("close the pool: %v", err)
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("VMs left after the batch: %+v", left)
	}
	for _, port := range resets.ports {
		if listening(t, port) {
			t.Errorf("port %d still listening after the batch", port)
		}
	}

	byTask := map[string][]schema.Record{}
	var readyS, actS []float64
	if _, err := schema.ReadRunRecords(out, func(r schema.Record) error {
		byTask[r.TaskID] = append(byTask[r.TaskID], r)
		for _, s := range r.Steps {
			for _, a := range s.Actions {
				if a.Action != desktop.DoneCode && a.Action != desktop.FailCode {
					readyS = append(readyS, a.ReadyS)
					actS = append(actS, a.ActS)
					// One round trip per step: the screenshot came
					// with the wait, from the executor.
					if a.CaptureS <= 0 || a.EncodeS <= 0 {
						t.Errorf("task %s attempt %d: action %q has no screenshot taken with its wait (capture_s %v, encode_s %v, obs_s %v)",
							r.TaskID, r.Attempt, a.Action, a.CaptureS, a.EncodeS, a.ObsS)
					}
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		recs := byTask[tk.ID]
		if len(recs) != 2 {
			t.Errorf("task %s: %d records, want 2", tk.ID, len(recs))
		}
		for _, r := range recs {
			msg := ""
			if r.Error != nil {
				msg = r.Error.Kind + ": " + r.Error.Message
			}
			if r.Status != schema.StatusOK || r.Reward == nil || *r.Reward != 1 {
				t.Errorf("task %s attempt %d on desktop %d: status %s, reward %v %s; want ok with reward 1", tk.ID, r.Attempt, r.Desktop, r.Status, fmtReward(r.Reward), msg)
			}
			// The record says which reset the attempt started from, and why.
			if r.Env == nil || r.Env.Reset == "" || r.Env.ResetWhy == "" {
				t.Errorf("task %s attempt %d: env %+v; want the reset and why", tk.ID, r.Attempt, r.Env)
			}
		}
	}
	// The home was clean for the last task even where an earlier task of
	// the same desktop had written in it since the last revert.
	proven := 0
	for _, hc := range byTask["legato-home-clean"] {
		for _, n := range byTask["legato-notes-type"] {
			if n.Desktop == hc.Desktop && n.EndedAt.Before(hc.StartedAt.Time) && n.Reward != nil && *n.Reward == 1 {
				proven++
				break
			}
		}
	}
	if proven == 0 {
		t.Errorf("no home-clean attempt ran after a notes attempt on its desktop: the batch proved nothing about the fast reset")
	}

	resets.mu.Lock()
	defer resets.mu.Unlock()
	reverted, fast := false, false
	for id, reps := range resets.kinds {
		for _, rep := range reps {
			t.Logf("reset for %s: %s (%s), restore %v, setup %v", id, rep.Kind, rep.Why, rep.Restore.Round(time.Millisecond), rep.Setup.Round(time.Millisecond))
			fast = fast || rep.Kind == ResetFast
			switch {
			case len(rep.Left) > 0:
				t.Errorf("reset for %s left %q", id, rep.Left)
			case id == "legato-os-echo" && rep.Kind == ResetLoadvm:
				reverted = true
			case rep.Kind == ResetNone, rep.Kind == ResetLoadvm:
			case id != "legato-os-echo" && rep.Kind == ResetFast:
			default:
				t.Errorf("task %s was reset with %q (%s)", id, rep.Kind, rep.Why)
			}
		}
	}
	if !reverted {
		t.Errorf("the os task never got a snapshot revert: %+v", resets.kinds["legato-os-echo"])
	}
	if !fast {
		t.Errorf("no fast reset ran in the batch: %+v", resets.kinds)
	}
	t.Logf("per action: median act_s %.2f, median ready_s %.2f (n=%d)", median(actS), median(readyS), len(readyS))
}

func fmtReward(r *float64) string {
	if r == nil {
		return "null"
	}
	return fmt.Sprint(*r)
}

// guestState is what a reset must bring back: the home directory's
// listing with each file's size, mode and checksum, /tmp's and /var/tmp's
// listings, the windows, and whether programs an attempt leaves (a
// terminal, a sleep, an editor) run.
func guestState(t *testing.T, ctx context.Context, c *guest.Client) string {
	t.Helper()
	res, err := c.Execute(ctx, guest.ShellLine(`cd /home/user && find . -printf '%p %s %m %u:%g\n' | LC_ALL=C sort && find . -type f -exec md5sum {} + | LC_ALL=C sort -k2
find /tmp /var/tmp -printf '%p %s %m %u:%g\n' | LC_ALL=C sort
wmctrl -l | cut -d' ' -f1,5-
for p in xterm sleep xedit; do pgrep -x $p >/dev/null && echo $p-running; done; true`))
	if err != nil || res.ReturnCode != 0 {
		t.Fatalf("guest state: %v %+v", err, res)
	}
	return res.Output
}

// dirty changes the guest the ways attempts do: files written, changed and
// deleted in the home and in /tmp and /var/tmp, and programs left running
// that no list names: a terminal frozen with ctrl+s, a sleep detached from
// everything, an editor's window.
func dirty(t *testing.T, ctx context.Context, d *Desktop) {
	t.Helper()
	res, err := d.Guest().Execute(ctx, guest.ShellLine(`cd /home/user && echo dirty > legato-dirty.txt && mkdir -p a/b && echo x > a/b/c && echo '# dirty' >> .bashrc && rm -f .profile
echo left > /tmp/legato-left.txt && mkdir -p /tmp/legato-dir && echo x > /tmp/legato-dir/x && echo left > /var/tmp/legato-left.txt
(setsid sleep 4242 </dev/null >/dev/null 2>&1 &)
(setsid xedit /tmp/legato-left.txt </dev/null >/dev/null 2>&1 &)
(setsid xterm -xrm "XTerm.vt100.allowTitleOps: false" -T legato-dirty </dev/null >/dev/null 2>&1 &)
for i in $(seq 300); do w=$(wmctrl -lx); case $w in *legato-dirty*) case $w in *xedit*) break;; esac;; esac; sleep 0.1; done
xdotool search --name legato-dirty windowactivate --sync key ctrl+s`))
	if err != nil || res.ReturnCode != 0 {
		t.Fatalf("dirty the guest: %v %+v", err, res)
	}
}

// TestIntegrationResets checks, on one VM, that the fast reset restores
// /home/user and kills the task programs, that the snapshot revert
// restores everything and sets the clock, and that NoFastReset reverts
// every domain. With -osworld.measure it then measures the resets, the
// waits and the guest calls.
func TestIntegrationResets(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-resets-")
	ctx := t.Context()
	vd := itDesktop(t, cfg)
	d := vd.Desktop
	c := d.Guest()
	clean := guestState(t, ctx, c)
	if strings.Contains(clean, "xterm-running") {
		t.Fatalf("fresh guest runs a terminal:\n%s", clean)
	}
	plain := func(domain string) desktop.Task {
		return desktop.Task{ID: "plain-" + domain, Domain: domain, Instruction: "x", Evaluator: json.RawMessage(`{"func":"infeasible"}`)}
	}
	check := func(what string, wantKind ResetKind) {
		t.Helper()
		if got := d.LastReset().Kind; got != wantKind {
			t.Errorf("%s: reset kind %q, want %q", what, got, wantKind)
		}
		if got := guestState(t, ctx, c); got != clean {
			t.Errorf("%s: guest state differs from the clean one:\nwant:\n%s\ngot:\n%s", what, clean, got)
		}
	}

	if err := d.Reset(ctx, plain("legato_term")); err != nil {
		t.Fatal(err)
	}
	check("first reset of a fresh VM", ResetNone)

	dirty(t, ctx, d)
	if err := d.Reset(ctx, plain("legato_term")); err != nil {
		t.Fatal(err)
	}
	check("fast reset", ResetFast)
	if rep := d.LastReset(); !slices.ContainsFunc(rep.Ended, func(p desktop.Process) bool { return p.Name == "xterm" }) {
		t.Errorf("fast reset ended %+v; want the terminal the dirt left", rep.Ended)
	}

	// Put the guest clock a day off: the revert brings back the
	// snapshot's time, which the desktop must then set to now.
	if err := d.sh.setClockTo(ctx, time.Now().Add(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	dirty(t, ctx, d)
	if err := d.Reset(ctx, plain("os")); err != nil {
		t.Fatal(err)
	}
	check("revert of an os task", ResetLoadvm)
	off, err := d.sh.clockOffset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest clock after the revert: %+.3fs off", off.Seconds())
	if off.Abs() > time.Second {
		t.Errorf("guest clock %v off after the revert; want it set from the host", off)
	}

	d.cfg.NoFastReset = true
	dirty(t, ctx, d)
	if err := d.Reset(ctx, plain("legato_term")); err != nil {
		t.Fatal(err)
	}
	check("reset with NoFastReset", ResetLoadvm)
	d.cfg.NoFastReset = false

	// Changes a fast reset does not restore make it fall back to the
	// snapshot, saying what changed: in a directory any user may write
	// (the test image has one), and, through sudo, in /etc.
	for _, ch := range []struct{ what, cmd, want string }{
		{"a world-writable directory", `echo x > /srv/legato-shared/left.txt`, "/srv/legato-shared"},
		{"/etc through sudo", `echo x | sudo tee /etc/legato-left.conf >/dev/null`, "/etc/legato-left.conf"},
	} {
		d.history.chooser = resetChooser{} // the fast reset is not measured: it runs
		dirty(t, ctx, d)
		if res, err := c.Execute(ctx, guest.ShellLine(ch.cmd)); err != nil || res.ReturnCode != 0 {
			t.Fatalf("%s: %v %+v", ch.cmd, err, res)
		}
		if err := d.Reset(ctx, plain("legato_term")); err != nil {
			t.Fatal(err)
		}
		check("fast reset after a change in "+ch.what, ResetFastThenLoadvm)
		if rep := d.LastReset(); !strings.Contains(rep.Why, ch.want) {
			t.Errorf("fast reset after a change in %s: why %q; want it to name %s", ch.what, rep.Why, ch.want)
		}
	}
	d.history.chooser = resetChooser{}

	if *itMeasure {
		measure(t, ctx, vd, clean)
	}

	name := vd.VM().Name()
	if err := vd.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := vd.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := vd.Reset(ctx, plain("os")); !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Reset after Close: %v; want ErrClosed", err)
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("%s left behind after Close: %+v", name, left)
	}
}

// TestIntegrationNothingCarriesOver is the fast reset's promise on a real
// guest: an attempt that leaves a window, a process, files in /tmp and
// /var/tmp and its terminal frozen with ctrl+s does not affect the next
// attempt on the same desktop, and the task scores the same as with
// NoFastReset. A control shows the scenario bites: restoring only the home
// (all the fast reset did before) leaves the frozen terminal to take the
// next attempt's typing, which then scores 0.
func TestIntegrationNothingCarriesOver(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := itConfig(t, "legato-itosw-carry-")
	ctx := t.Context()
	tk := termEchoTask(t)
	d := itDesktop(t, cfg).Desktop
	c := d.Guest()
	sh := guestSh(t, c)
	typeIt := desktop.Action{Kind: desktop.Code, Code: `pyautogui.typewrite('echo hello legato > ~/out.txt\n')`}
	// play runs the attempt after the desktop is at the task's start: the
	// agent types into the focused window.
	play := func(what string) float64 {
		t.Helper()
		if err := d.WaitAfterReset(ctx); err != nil {
			t.Fatal(err)
		}
		if r, err := d.Act(ctx, typeIt); err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: act: %v %+v", what, err, r)
		}
		if err := d.WaitBeforeEval(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := d.Evaluate(ctx, tk)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: reward %v", what, r)
		return r
	}
	attempt := func(what string) (float64, ResetReport) {
		t.Helper()
		if err := d.Reset(ctx, tk); err != nil {
			t.Fatal(err)
		}
		rep := d.LastReset()
		t.Logf("%s: reset %s (%s) in %v; ended %+v, closed %q", what, rep.Kind, rep.Why, rep.Restore.Round(time.Millisecond), rep.Ended, rep.Closed)
		if len(rep.Left) > 0 {
			t.Errorf("%s: the reset left %q", what, rep.Left)
		}
		// Nothing of the earlier attempts is there: one terminal (the
		// setup's), no sleep, no editor, no files in /tmp and /var/tmp.
		if got := sh(`wmctrl -l | grep -c legato-term; pgrep -x sleep; pgrep -x xedit; ls /tmp /var/tmp | grep -c legato-left; true`); got != "1\n0" {
			t.Errorf("%s: after the reset: %q; want one terminal and nothing left", what, got)
		}
		return play(what), rep
	}
	// leave is what the attempt leaves behind: its own terminal frozen by
	// ctrl+s, a process, a window, files in /tmp and /var/tmp.
	leave := func() {
		t.Helper()
		sh(`xdotool search --name legato-term windowactivate --sync key ctrl+s
echo left > /tmp/legato-left.txt && echo left > /var/tmp/legato-left.txt
(setsid sleep 4242 </dev/null >/dev/null 2>&1 &)
(setsid xedit /tmp/legato-left.txt </dev/null >/dev/null 2>&1 &)
for i in $(seq 300); do wmctrl -lx | grep -qi xedit && break; sleep 0.1; done
wmctrl -lx | grep -qi xedit`)
	}

	scores := map[ResetKind][]float64{}
	r, rep := attempt("attempt 1")
	if rep.Kind != ResetNone {
		t.Errorf("first reset of a fresh VM: %s", rep.Kind)
	}
	scores[ResetNone] = append(scores[ResetNone], r)
	leave()

	// Control: restore the home only, then the task's setup; the frozen
	// terminal comes first in the window list, so activating the task's
	// window picks it.
	sh(`rsync -a --delete ` + cfg.withDefaults().BaselineDir + `/ /home/user/`)
	if err := d.setup.Run(ctx, tk, tk.Setup); err != nil {
		t.Fatal(err)
	}
	sh(`for i in $(seq 300); do [ "$(wmctrl -l | grep -c legato-term)" -ge 2 ] && break; sleep 0.1; done; wmctrl -a legato-term`)
	if r := play("control: home restored only"); r != 0 {
		t.Errorf("control: reward %v; want 0: the frozen terminal should have taken the typing, else this test proves nothing", r)
	}

	for i := 2; i <= 3; i++ {
		r, rep := attempt(fmt.Sprintf("attempt %d (fast reset)", i))
		if rep.Kind != ResetFast && rep.Kind != ResetLoadvm {
			t.Errorf("attempt %d: reset %s (%s)", i, rep.Kind, rep.Why)
		}
		scores[rep.Kind] = append(scores[rep.Kind], r)
		leave()
	}
	d.cfg.NoFastReset = true
	for i := 4; i <= 5; i++ {
		r, rep := attempt(fmt.Sprintf("attempt %d (NoFastReset)", i))
		if rep.Kind != ResetLoadvm {
			t.Errorf("attempt %d with NoFastReset: reset %s (%s)", i, rep.Kind, rep.Why)
		}
		scores["no-fast-reset"] = append(scores["no-fast-reset"], r)
		leave()
	}
	t.Logf("rewards by reset: %v", scores)
	for kind, rs := range scores {
		for _, r := range rs {
			if r != 1 {
				t.Errorf("reset %s: rewards %v; want 1 every time", kind, rs)
				break
			}
		}
	}
	if len(scores[ResetFast]) == 0 {
		t.Errorf("no attempt ran after a fast reset: %v", scores)
	}
}

// TestIntegrationCrashThenSweep kills a collector mid-batch (SIGKILL: no
// cleanup at all) and checks that the next run's pool removes the VM it
// left.
func TestIntegrationCrashThenSweep(t *testing.T) {
	cfg := itConfig(t, "legato-itosw-crash-")
	if os.Getenv(crashChildEnv) != "" {
		crashChild(t, cfg)
		return
	}
	ctx := t.Context()
	if _, err := vm.Sweep(ctx, cfg.VM); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrationCrashThenSweep$", "-osworld.image="+*itImage)
	cmd.Env = append(os.Environ(), crashChildEnv+"=1")
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var name string
	var port, steps int
	var resets []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if n, _ := fmt.Sscanf(line, "STARTED %s %d", &name, &port); n == 2 {
			continue
		}
		if k, ok := strings.CutPrefix(line, "RESET "); ok {
			resets = append(resets, k)
			continue
		}
		if strings.HasPrefix(line, "STEP") {
			if steps++; steps >= 2 {
				break // the batch is well under way
			}
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	io.Copy(io.Discard, out)
	cmd.Wait()
	if name == "" || steps < 2 {
		t.Fatalf("the child did not get into its batch (vm %q, %d steps)", name, steps)
	}
	// The killed VM's overlay holds a golden state too.
	if !slices.Equal(resets, []string{string(ResetGoldenBuild)}) {
		t.Errorf("the child's resets: %q; want it to have taken a golden state", resets)
	}

	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Name != name || !left[0].Running {
		t.Errorf("after the crash: %+v; want %s running", left, name)
	}
	p, err := NewPool(ctx, cfg) // the next run
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	left, err = vm.List(ctx, cfg.VM)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("after the next run's sweep: %+v", left)
	}
	if listening(t, port) {
		t.Errorf("the crashed VM's port %d still listens", port)
	}

	// legato rl gc: an orphan overlay volume of the prefix (its domain
	// already gone) is listed and removed.
	orphan := cfg.VM.NamePrefix + "9-deadbeef"
	if out, err := exec.Command("virsh", "-q", "-c", "qemu:///system", "vol-create-as", vm.DefaultStoragePool, orphan+".qcow2", "1M", "--format", "qcow2").CombinedOutput(); err != nil {
		t.Fatalf("make an orphan overlay: %v: %s", err, out)
	}
	var gcOut strings.Builder
	if err := GC(ctx, cfg, &gcOut); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("removed "+orphan+" on local (volumes only; 1 volumes)\n", gcOut.String()); diff != "" {
		t.Errorf("gc output (-want +got):\n%s", diff)
	}
	gcOut.Reset()
	if err := GC(ctx, cfg, &gcOut); err != nil || gcOut.String() != "no leftover VMs\n" {
		t.Errorf("second gc: %q, %v; want nothing left", gcOut.String(), err)
	}
}

// crashChild is the collector that gets killed: one desktop, an agent that
// waits forever; it prints STARTED when its VM is up and STEP per model
// call.
func crashChild(t *testing.T, cfg Config) {
	ctx := t.Context()
	cfg.Golden.Off = false
	p, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: func(req policytest.Request) string {
		fmt.Printf("STEP %d\n", req.Step)
		return "Action: wait.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"wait\", \"time\": 1}}\n</tool_call>"
	}})
	factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := p.New(ctx, slot)
		if err != nil {
			return nil, err
		}
		vd := d.(*VMDesktop)
		fmt.Printf("STARTED %s %d\n", vd.VM().Name(), vd.VM().Ports().Guest)
		return printingResets{vd}, nil
	}
	// A setup step: the attempt starts from a golden state, a snapshot in
	// the overlay the sweep must remove with the rest.
	tasks := []desktop.Task{{ID: "forever", Domain: "legato_term", Instruction: "Wait.", Evaluator: json.RawMessage(`{"func":"infeasible"}`),
		Setup: []desktop.SetupStep{{Type: "execute", Parameters: json.RawMessage(`{"command":["sh","-c","echo set > /home/user/set.txt"]}`)}}}}
	_, err = rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "crash"}, rl.CollectOptions{
		Out: t.TempDir(), NewDesktop: factory, Desktops: 1, Group: 1, MaxSteps: 1000, // the most Collect allows; it is killed long before
	})
	t.Fatalf("the batch ended (%v); it should have been killed", err)
}

// printingResets prints the kind of each reset of its desktop.
type printingResets struct{ *VMDesktop }

func (p printingResets) Reset(ctx context.Context, task desktop.Task) error {
	err := p.VMDesktop.Reset(ctx, task)
	if err == nil {
		fmt.Printf("RESET %s\n", p.LastReset().Kind)
	}
	return err
}

// countingTransport counts the screenshots asked through it.
type countingTransport struct {
	base  http.RoundTripper
	shots atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/screenshot" {
		c.shots.Add(1)
	}
	return c.base.RoundTrip(r)
}

// measurement is one quantity, measured several times.
type measurement struct {
	Seconds []float64 `json:"seconds"`
}

func (m *measurement) add(d time.Duration) { m.Seconds = append(m.Seconds, d.Seconds()) }

func (m measurement) String() string {
	s := slices.Clone(m.Seconds)
	sort.Float64s(s)
	if len(s) == 0 {
		return "no samples"
	}
	return fmt.Sprintf("min %.3f / median %.3f / max %.3f (n=%d)", s[0], median(s), s[len(s)-1], len(s))
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	s = slices.Clone(s)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// measure times, side by side on one VM: each kind of reset until the
// guest answers (checked to restore the clean state), with its clock set,
// and the guest clock right after each; steps with the ready signal that
// compares screenshots against the one that watches the screen (their
// screenshots are counted: a "_count" is a number, not seconds); and the
// latency of screenshots and commands.
func measure(t *testing.T, ctx context.Context, vd *VMDesktop, clean string) {
	d, v := vd.Desktop, vd.VM()
	c := d.Guest()
	n := *itReps
	res := map[string]*measurement{}
	m := func(k string) *measurement {
		if res[k] == nil {
			res[k] = &measurement{}
		}
		return res[k]
	}
	offset := func(k string) {
		off, err := d.sh.clockOffset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m(k).add(off)
	}
	restored := func(kind string) {
		if got := guestState(t, ctx, c); got != clean {
			t.Errorf("%s did not restore the clean state:\n%s", kind, got)
		}
	}
	for range n {
		dirty(t, ctx, d)
		t0 := time.Now()
		res, err := d.fastStep(ctx, desktop.Task{}, resetStep{kind: ResetFast})
		r := res.clean
		if err != nil {
			t.Fatal(err)
		}
		m("reset_fast_after_dirt").add(time.Since(t0))
		for phase, s := range r.Seconds {
			m("reset_fast_after_dirt_in_guest_" + phase).add(time.Duration(s * float64(time.Second)))
		}
		offset("clock_offset_after_fast")
		restored("fast reset")
		t0 = time.Now()
		if _, err := d.fastStep(ctx, desktop.Task{}, resetStep{kind: ResetFast}); err != nil {
			t.Fatal(err)
		}
		m("reset_fast_nothing_to_undo").add(time.Since(t0))
	}
	for range n {
		dirty(t, ctx, d)
		t0 := time.Now()
		if err := d.restore(ctx, ResetLoadvm, d.vm.RevertLoadvm, newSeed()); err != nil {
			t.Fatal(err)
		}
		m("reset_loadvm_with_clock_set").add(time.Since(t0))
		offset("clock_offset_after_loadvm_with_clock_set")
		restored("loadvm")
	}
	// The clock set as before (a call to read the guest's clock, then a
	// shift through sudo), and as a separate call pair through the helper.
	sudo := *d.sh
	sudo.noHelper = true
	for _, r := range []struct {
		name   string
		revert func(context.Context) error
		sh     *guestShell
	}{
		{"revert_libvirt", v.RevertLibvirt, d.sh},
		{"revert_loadvm", v.RevertLoadvm, d.sh},
		{"revert_loadvm_sudo", v.RevertLoadvm, &sudo},
	} {
		for range n {
			dirty(t, ctx, d)
			c.CloseIdleConnections()
			t0 := time.Now()
			if err := r.revert(ctx); err != nil {
				t.Fatal(err)
			}
			m(r.name + "_until_answering").add(time.Since(t0))
			c.CloseIdleConnections()
			t1 := time.Now()
			if err := r.sh.setClock(ctx); err != nil {
				t.Fatal(err)
			}
			m(r.name + "_then_separate_clock_set").add(time.Since(t1))
			offset("clock_offset_after_" + r.name + "_and_clock_set")
			restored(r.name)
		}
	}

	// Per step: screenshot and command latencies, and the wait after an
	// action (typing into a terminal) with the ready signal.
	if err := d.Reset(ctx, desktop.Task{ID: "term", Domain: "legato_term", Instruction: "x", Evaluator: json.RawMessage(`{"func":"infeasible"}`),
		Setup: []desktop.SetupStep{
			{Type: "launch", Parameters: json.RawMessage(`{"command": ["xterm", "-xrm", "XTerm.vt100.allowTitleOps: false", "-T", "legato-term"]}`)},
			{Type: "execute_with_verification", Parameters: json.RawMessage(`{"command": ["true"], "verification": {"window_exists": "legato-term"}, "max_wait_time": 90, "check_interval": 0.5}`)},
			{Type: "activate_window", Parameters: json.RawMessage(`{"window_name": "legato-term"}`)},
		}}); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		t0 := time.Now()
		if _, err := c.Screenshot(ctx); err != nil {
			t.Fatal(err)
		}
		m("screenshot").add(time.Since(t0))
		t0 = time.Now()
		if _, err := c.Execute(ctx, guest.Argv("true")); err != nil {
			t.Fatal(err)
		}
		m("execute_true").add(time.Since(t0))
		t0 = time.Now()
		if _, err := d.sh.quiet(ctx, 0); err != nil {
			t.Fatal(err)
		}
		m("quiet_probe_overhead").add(time.Since(t0))
	}
	// Steps on a screen that settles as the action ends (typing into a
	// terminal), counting the wait's screenshots: comparing screenshots
	// (what the wait did before) against watching the screen in the guest.
	counter := &countingTransport{base: http.DefaultTransport}
	counted, err := guest.New(c.URL(), guest.Options{HTTPClient: &http.Client{Transport: counter}})
	if err != nil {
		t.Fatal(err)
	}
	d.guest = counted
	for _, mode := range []struct {
		name     string
		noDamage bool
	}{{"compare_screenshots", true}, {"watch_screen", false}} {
		d.cfg.Ready.NoDamage = mode.noDamage
		for i := range n {
			t0 := time.Now()
			r, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: fmt.Sprintf("pyautogui.typewrite('echo step %d'); pyautogui.press('enter')", i)})
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("act: %v %+v", err, r)
			}
			m("execute_pyautogui_action").add(time.Since(t0))
			shots := counter.shots.Load()
			t1 := time.Now()
			ready, err := d.WaitReady(ctx, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !ready.Settled {
				// Under a loaded host a wait can reach its bound: counted,
				// not failed, since this only measures.
				m("step_" + mode.name + "_unsettled_count").add(time.Second)
			}
			m("step_" + mode.name + "_screenshots_count").add(time.Duration(counter.shots.Load()-shots) * time.Second)
			m("step_" + mode.name + "_wait").add(time.Since(t1))
			m("step_" + mode.name + "_act_and_wait").add(time.Since(t0))
		}
	}
	d.cfg.Ready.NoDamage = false
	d.guest = c
	counted.CloseIdleConnections()
	t0 := time.Now()
	if err := d.WaitBeforeEval(ctx); err != nil {
		t.Fatal(err)
	}
	m("wait_before_eval_ready_signal").add(time.Since(t0))

	// Cold boots last: the fresh overlay has no home baseline.
	for range n {
		t0 := time.Now()
		if err := v.ColdBoot(ctx); err != nil {
			t.Fatal(err)
		}
		m("cold_boot_fresh_overlay").add(time.Since(t0))
		c.CloseIdleConnections()
		offset("clock_offset_after_cold_boot")
	}

	keys := slices.Sorted(maps.Keys(res))
	var b strings.Builder
	fmt.Fprintf(&b, "measurements on %s (accel %s: %s), seconds:\n", v.Name(), v.Accel(), accelWords(v.Accel()))
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %s\n", k, res[k])
	}
	t.Log(b.String())
	if *itMeasureOut != "" {
		data, err := json.MarshalIndent(map[string]any{"accel": v.Accel(), "results": res}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*itMeasureOut, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func accelWords(a vm.Accel) string {
	if a == vm.AccelTCG {
		return "TCG software emulation"
	}
	return "hardware virtualisation"
}
