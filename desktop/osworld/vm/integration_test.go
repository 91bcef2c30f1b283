//go:build integration

// Integration tests on real libvirt/QEMU with legato's Debian test guest.
// They need the daemons (.ci/libvirt-up.sh) and the image
// (desktop/osworld/testdata/image/build.sh), and run as root:
//
//	go test -race -tags integration ./desktop/osworld/vm/ [-vm.image DIR] [-vm.measure]
package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sync/errgroup"
)

var (
	imageDir   = flag.String("vm.image", envOr("LEGATO_GUEST_IMAGE", "/var/tmp/legato-guest"), "directory with the test guest (base.qcow2, vmlinux, initrd.img, cmdline)")
	measure    = flag.Bool("vm.measure", false, "also measure reset times (several minutes under software emulation)")
	measureN   = flag.Int("vm.reps", 5, "repetitions per reset kind for -vm.measure")
	measureOut = flag.String("vm.measure.out", "", "write the -vm.measure results as JSON to this file")
)

const crashChildEnv = "LEGATO_VM_CRASH_CHILD"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// itBootCacheEnv hands the boot cache to the crash children.
const itBootCacheEnv = "LEGATO_VM_IT_BOOT_CACHE"

var itBootCacheOnce = sync.OnceValues(func() (string, error) {
	if dir := os.Getenv(itBootCacheEnv); dir != "" {
		return dir, nil // a crash child's: its parent removes it
	}
	dir, err := os.MkdirTemp("", "legato-vm-it-bootcache-")
	if err != nil {
		return "", err
	}
	atExit = append(atExit, func() { os.RemoveAll(dir) })
	return dir, os.Setenv(itBootCacheEnv, dir)
})

// itBootCache is a boot cache (Config.BootCache) the tests whose VMs are
// not about booting share, crash children too: the first VM of a machine
// boots and fills it, the later ones start from it.
func itBootCache(t *testing.T) string {
	t.Helper()
	dir, err := itBootCacheOnce()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// testConfig is a VM configuration for the test guest, small enough for
// two or three VMs on a CI machine.
func testConfig(t *testing.T, prefix string) Config {
	t.Helper()
	for _, f := range []string{"base.qcow2", "vmlinux", "initrd.img", "cmdline"} {
		if _, err := os.Stat(filepath.Join(*imageDir, f)); err != nil {
			t.Fatalf("test guest incomplete (%v): build it with desktop/osworld/testdata/image/build.sh %s", err, *imageDir)
		}
	}
	cmdline, err := os.ReadFile(filepath.Join(*imageDir, "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		NamePrefix:  prefix,
		BaseImage:   filepath.Join(*imageDir, "base.qcow2"),
		Kernel:      filepath.Join(*imageDir, "vmlinux"),
		Initrd:      filepath.Join(*imageDir, "initrd.img"),
		Cmdline:     strings.TrimSpace(string(cmdline)),
		VCPUs:       2,
		MemoryMiB:   1536,
		BootTimeout: 4 * time.Minute,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// guest talks to the guest server with plain net/http (the guest client
// package is not a dependency of this one).
type guest struct {
	t    *testing.T
	base string
	http *http.Client
}

func newGuest(t *testing.T, v *VM) *guest {
	return &guest{t: t, base: v.Ports().GuestURL(), http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
}

// sh runs a shell command in the guest through POST /execute and returns
// its stdout; a non-zero exit fails the test.
func (g *guest) sh(ctx context.Context, cmd string) string {
	g.t.Helper()
	out, rc, err := g.try(ctx, cmd)
	if err != nil {
		g.t.Fatalf("guest %q: %v", cmd, err)
	}
	if rc != 0 {
		g.t.Fatalf("guest %q: exit %d: %s", cmd, rc, out)
	}
	return strings.TrimSpace(out)
}

func (g *guest) try(ctx context.Context, cmd string) (string, int, error) {
	body, _ := json.Marshal(map[string]any{"command": []string{"sh", "-c", cmd}, "shell": false})
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+"/execute", bytes.NewReader(body))
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.http.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", 0, err
	}
	var r struct {
		Status     string `json:"status"`
		Output     string `json:"output"`
		Error      string `json:"error"`
		ReturnCode int    `json:"returncode"`
		Message    string `json:"message"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return r.Output + r.Error, r.ReturnCode, nil
}

// state is what a restore must bring back.
type state struct {
	BootID    string
	DirtyFile bool // /home/user/legato-dirty exists
	DirtyProc bool // the marker process runs
}

// marker is the dirty process's command line; "[s]leep" keeps pgrep from
// matching the shell that runs it.
const marker = "sleep 100017"

func (g *guest) state(ctx context.Context) state {
	out := g.sh(ctx, `cat /proc/sys/kernel/random/boot_id;
		[ -e /home/user/legato-dirty ] && echo file=1 || echo file=0;
		pgrep -f '[s]leep 100017' >/dev/null && echo proc=1 || echo proc=0`)
	f := strings.Fields(out)
	if len(f) != 3 {
		g.t.Fatalf("guest state: %q", out)
	}
	return state{BootID: f[0], DirtyFile: f[1] == "file=1", DirtyProc: f[2] == "proc=1"}
}

// dirty writes a file to the guest's disk and starts a process, the things
// a restore must undo.
func (g *guest) dirty(ctx context.Context) {
	g.sh(ctx, `echo dirty > /home/user/legato-dirty && sync;
		setsid `+marker+` </dev/null >/dev/null 2>&1 &`)
	if st := g.state(ctx); !st.DirtyFile || !st.DirtyProc {
		g.t.Fatalf("guest not dirty after writing: %+v", st)
	}
}

// clockOffset is the guest's clock minus the host's, in seconds.
func (g *guest) clockOffset(ctx context.Context) float64 {
	before := time.Now()
	out := g.sh(ctx, "date +%s.%N")
	after := time.Now()
	guestT, err := strconv.ParseFloat(out, 64)
	if err != nil {
		g.t.Fatalf("guest date: %q", out)
	}
	host := float64(before.Add(after.Sub(before)/2).UnixNano()) / 1e9
	return guestT - host
}

// setClock sets the guest clock to the host's, as a desktop must after a
// restore.
func (g *guest) setClock(ctx context.Context) {
	g.sh(ctx, fmt.Sprintf("sudo -n date -s @%.3f >/dev/null", float64(time.Now().UnixNano())/1e9))
}

// qemuListeners returns the local addresses of the TCP sockets QEMU
// processes listen on (ss -ltnp).
func qemuListeners(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ss", "-Hltnp").Output()
	if err != nil {
		t.Fatalf("ss -ltnp: %v", err)
	}
	var addrs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.Contains(line, "qemu-system") {
			addrs = append(addrs, f[3])
		}
	}
	return addrs
}

func listening(t *testing.T, port int) bool {
	t.Helper()
	out, err := exec.Command("ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	return strings.TrimSpace(string(out)) != ""
}

// assertGone checks that nothing of the prefix is left: no domain, no
// file, none of the ports listening.
func assertGone(t *testing.T, cfg Config, ports []int) {
	t.Helper()
	left, err := List(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("left behind: %+v", left)
	}
	for _, p := range ports {
		if listening(t, p) {
			t.Errorf("port %d still listening", p)
		}
	}
}

// plantBootEntry writes a boot cache entry that does not load (an overlay
// with no clean snapshot) under the key of cfg's VMs, and returns its
// overlay's path.
func plantBootEntry(t *testing.T, cfg Config) string {
	t.Helper()
	cfg = cfg.withDefaults()
	h, err := OpenHost(cfg.Hosts[0], cfg, HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	accel, _ := resolveAccel(cfg.Accel, DetectAccel)
	v := &VM{cfg: cfg, host: h, conn: h.connect(), accel: accel}
	defer v.conn.close()
	if v.images, err = h.imagePaths(t.Context()); err != nil {
		t.Fatal(err)
	}
	m, err := v.bootManifest(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.BootCache, m.key())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(dir, bootCacheOverlay)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", v.images[RoleBase], ov).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	return ov
}

// sweepFirst removes what an earlier run of the prefix left, and uploads
// the test guest's files to the host's storage pool if it lacks them.
func sweepFirst(t *testing.T, cfg Config) {
	t.Helper()
	syncImages(t, cfg)
	removed, err := Sweep(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) > 0 {
		t.Logf("swept leftovers of an earlier run: %v", removed)
	}
}

// syncImages uploads the image files to each of cfg's hosts that lacks
// them.
func syncImages(t *testing.T, cfg Config) {
	t.Helper()
	cfg = cfg.withDefaults()
	for _, spec := range cfg.Hosts {
		h, err := OpenHost(spec, cfg, HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.SyncImages(t.Context(), nil)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func allPorts(vs ...*VM) []int {
	var ps []int
	for _, v := range vs {
		p := v.Ports()
		ps = append(ps, p.Guest, p.DevTools, p.VLC)
	}
	return ps
}

func TestIntegrationTwoVMsRevertAndClose(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := testConfig(t, "legato-it-")
	sweepFirst(t, cfg)
	ctx := t.Context()
	// The two VMs start together with a boot cache: one boots and fills
	// it, the other waits and starts from it. An entry already there
	// under their key that does not load (no clean snapshot in it) is
	// removed first, and the VM that tried it boots.
	cfg.BootCache = itBootCache(t)
	bad := plantBootEntry(t, cfg)
	// A probe that can be made to hang, to close a VM in the middle of a
	// revert.
	var hang atomic.Bool
	hanging := make(chan struct{}, 1)
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	cfg.Ready = func(ctx context.Context, p Ports) error {
		if hang.Load() {
			select {
			case hanging <- struct{}{}:
			default: // the test already knows
			}
			<-ctx.Done()
			return ctx.Err()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.GuestURL()+"/platform", nil)
		if err != nil {
			return err
		}
		resp, err := probe.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}

	vms := make([]*VM, 2)
	var g errgroup.Group
	for i := range vms {
		g.Go(func() error {
			v, err := Start(ctx, cfg, i)
			vms[i] = v
			return err
		})
	}
	err := g.Wait()
	t.Cleanup(func() {
		for _, v := range vms {
			if v != nil {
				v.Close()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	restored := -1
	for i, v := range vms {
		tm := v.Timings()
		t.Logf("%s: accel %s, ports %+v, define %v, boot %v, snapshot %v, from the boot cache %v", v.Name(), v.Accel(), v.Ports(), tm.Define, tm.Boot, tm.Snapshot, tm.Restored)
		if tm.Restored {
			if restored >= 0 {
				t.Errorf("both VMs started from the boot cache; want one to boot and fill it")
			}
			restored = i
		}
	}
	if restored < 0 {
		t.Fatalf("no VM started from the boot cache")
	}
	if st, err := os.Stat(bad); err != nil || st.Size() <= 1<<20 {
		t.Errorf("boot cache entry %s: %v, %v; want the booted VM's overlay with its clean state (more than 1 MiB) in place of the planted one", bad, st, err)
	}
	// The restored VM has its own disk: a file it writes is not the
	// other's.
	booted := vms[1-restored]
	gr, gb := newGuest(t, vms[restored]), newGuest(t, booted)
	gr.dirty(ctx)
	if st := gb.state(ctx); st.DirtyFile || st.DirtyProc {
		t.Errorf("%s dirtied by its copy %s: %+v", booted.Name(), vms[restored].Name(), st)
	}
	if err := vms[restored].Revert(ctx); err != nil {
		t.Fatalf("%s: revert: %v", vms[restored].Name(), err)
	}

	// Nothing listens beyond loopback: every QEMU socket, and our ports.
	for _, a := range qemuListeners(t) {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("a QEMU process listens on %s, beyond 127.0.0.1", a)
		}
	}
	for _, p := range allPorts(vms...) {
		if !listening(t, p) {
			t.Errorf("forwarded port %d is not listening", p)
		}
	}

	for _, v := range vms {
		gu := newGuest(t, v)
		clean := gu.state(ctx)
		if clean.DirtyFile || clean.DirtyProc || clean.BootID == "" {
			t.Fatalf("%s: fresh guest is not clean: %+v", v.Name(), clean)
		}
		for _, r := range []struct {
			name   string
			revert func(context.Context) error
		}{{"libvirt", v.RevertLibvirt}, {"loadvm", v.RevertLoadvm}, {"default", v.Revert}} {
			gu.dirty(ctx)
			if err := r.revert(ctx); err != nil {
				t.Fatalf("%s: revert (%s): %v", v.Name(), r.name, err)
			}
			if diff := cmp.Diff(clean, gu.state(ctx)); diff != "" {
				t.Errorf("%s: state after revert (%s) (-want +got):\n%s", v.Name(), r.name, diff)
			}
			t.Logf("%s: revert (%s) took %v; guest clock %+.1fs off", v.Name(), r.name, v.Timings().LastReset, gu.clockOffset(ctx))
		}
	}

	// Close while a revert waits for the guest: the revert returns
	// ErrClosed at once.
	hang.Store(true)
	reverted := make(chan error, 1)
	go func() { reverted <- vms[0].RevertLoadvm(ctx) }()
	<-hanging
	if err := vms[0].Close(); err != nil {
		t.Errorf("close during revert: %v", err)
	}
	if err := <-reverted; !errors.Is(err, ErrClosed) {
		t.Errorf("revert interrupted by close: %v, want ErrClosed", err)
	}

	ports := allPorts(vms...)
	for _, v := range vms {
		if err := v.Close(); err != nil {
			t.Errorf("close %s: %v", v.Name(), err)
		}
		if err := v.Close(); err != nil {
			t.Errorf("second close %s: %v", v.Name(), err)
		}
		if err := v.Revert(ctx); !errors.Is(err, ErrClosed) {
			t.Errorf("revert after close: %v, want ErrClosed", err)
		}
	}
	assertGone(t, cfg, ports)
}

// Ctrl-C while a VM boots: Start returns the ctx's error and removes what
// it had created.
func TestIntegrationCancelDuringBootLeavesNothing(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := testConfig(t, "legato-itcancel-")
	sweepFirst(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ports Ports
	probed := false
	cfg.Ready = func(_ context.Context, p Ports) error {
		// The domain is defined and running by now: cancel as Ctrl-C would.
		ports, probed = p, true
		cancel()
		return errors.New("not yet")
	}
	v, err := Start(ctx, cfg, 0)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start after cancel: %v, %v; want context.Canceled", v, err)
	}
	if !probed {
		t.Fatal("Start never probed the guest")
	}
	assertGone(t, cfg, []int{ports.Guest, ports.DevTools, ports.VLC})
}

// A run that is killed (SIGKILL: no cleanup at all) leaves its VM behind;
// Sweep finds and removes it.
func TestIntegrationCrashThenSweep(t *testing.T) {
	cfg := testConfig(t, "legato-itcrash-")
	cfg.BootCache = itBootCache(t)
	if os.Getenv(crashChildEnv) != "" {
		// The child: start a VM, say so, wait to be killed.
		v, err := Start(context.Background(), cfg, 7)
		if err != nil {
			fmt.Printf("FAILED %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("STARTED %s %d\n", v.Name(), v.Ports().Guest)
		select {}
	}
	sweepFirst(t, cfg)

	args := []string{"-test.run=^TestIntegrationCrashThenSweep$", "-vm.image=" + *imageDir}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), crashChildEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var name string
	var port int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if _, err := fmt.Sscanf(line, "STARTED %s %d", &name, &port); err == nil {
			break
		}
		if strings.HasPrefix(line, "FAILED") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	io.Copy(io.Discard, out) // EOF once the killed child's end is closed
	cmd.Wait()
	if name == "" {
		t.Fatal("the child did not start a VM")
	}

	left, err := List(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Leftover{{Host: "local", Name: name, Domain: true, Running: true, Volumes: []string{name + ".qcow2"}}}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("after the crash (-want +got):\n%s", diff)
	}
	removed, err := Sweep(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{name}, removed); diff != "" {
		t.Errorf("Sweep removed (-want +got):\n%s", diff)
	}
	assertGone(t, cfg, []int{port})
}

// measurement is one kind of reset, timed and checked.
type measurement struct {
	Seconds []float64 `json:"seconds"`
	// ClockOffset is the guest clock minus the host's right after the
	// restore, before it is set again.
	ClockOffset []float64 `json:"clock_offset_s"`
	// Identical reports, per restore, that the state came back (file and
	// process gone) in the same boot (reverts) or a new one (cold boot).
	Identical []bool `json:"identical"`
}

func (m measurement) summary() string {
	s := slices.Clone(m.Seconds)
	sort.Float64s(s)
	if len(s) == 0 {
		return "no samples"
	}
	return fmt.Sprintf("min %.2f median %.2f max %.2f (n=%d)", s[0], median(s), s[len(s)-1], len(s))
}

func median(s []float64) float64 {
	s = slices.Clone(s)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// TestIntegrationResetTimes measures, side by side on one VM, how long
// each reset takes until the guest answers again.
func TestIntegrationResetTimes(t *testing.T) {
	if !*measure || os.Getenv(crashChildEnv) != "" {
		t.Skip("run with -vm.measure")
	}
	cfg := testConfig(t, "legato-itmeasure-")
	sweepFirst(t, cfg)
	ctx := t.Context()
	v, err := Start(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	gu := newGuest(t, v)
	clean := gu.state(ctx)
	res := map[string]*measurement{
		"snapshot_create":         {},
		"revert_libvirt":          {},
		"revert_loadvm":           {},
		"cold_boot_fresh_overlay": {},
		"execute_pyautogui":       {},
		"execute_xdotool":         {},
	}
	dom, err := v.domain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range *measureN {
		// Snapshot creation, on scratch snapshots deleted right after.
		name := fmt.Sprintf("legato-measure-%d", i)
		t0 := time.Now()
		err := v.conn.do(ctx, "create snapshot", func(lv *libvirt.Libvirt) error {
			_, err := lv.DomainSnapshotCreateXML(dom, "<domainsnapshot><name>"+name+"</name></domainsnapshot>", uint32(libvirt.DomainSnapshotCreateAtomic))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		res["snapshot_create"].Seconds = append(res["snapshot_create"].Seconds, time.Since(t0).Seconds())
		err = v.conn.do(ctx, "delete snapshot", func(lv *libvirt.Libvirt) error {
			snap, err := lv.DomainSnapshotLookupByName(dom, name, 0)
			if err != nil {
				return err
			}
			return lv.DomainSnapshotDelete(snap, 0)
		})
		if err != nil {
			t.Fatal(err)
		}

		for _, r := range []struct {
			key     string
			reset   func(context.Context) error
			newBoot bool
		}{{"revert_libvirt", v.RevertLibvirt, false}, {"revert_loadvm", v.RevertLoadvm, false}, {"cold_boot_fresh_overlay", v.ColdBoot, true}} {
			gu.dirty(ctx)
			if err := r.reset(ctx); err != nil {
				t.Fatalf("%s: %v", r.key, err)
			}
			took := v.Timings().LastReset
			off := gu.clockOffset(ctx)
			st := gu.state(ctx)
			ok := !st.DirtyFile && !st.DirtyProc && (st.BootID == clean.BootID) != r.newBoot
			m := res[r.key]
			m.Seconds = append(m.Seconds, took.Seconds())
			m.ClockOffset = append(m.ClockOffset, off)
			m.Identical = append(m.Identical, ok)
			if !ok {
				t.Errorf("%s #%d: state %+v, clean was %+v", r.key, i, st, clean)
			}
			if r.newBoot {
				clean = st // a cold boot is a new clean state with a new boot id
			}
			gu.setClock(ctx)
			// Loose: under emulation on a busy host the request that sets
			// the clock takes a second or two, and the guest clock lags.
			if off := gu.clockOffset(ctx); off < -5 || off > 5 {
				t.Errorf("%s #%d: guest clock still %+.1fs off after setting it", r.key, i, off)
			}
		}

		for key, cmd := range map[string]string{
			"execute_pyautogui": `python -c "import pyautogui; pyautogui.moveTo(100, 100)"`,
			"execute_xdotool":   `xdotool mousemove 100 100`,
		} {
			t0 := time.Now()
			gu.sh(ctx, cmd)
			res[key].Seconds = append(res[key].Seconds, time.Since(t0).Seconds())
		}
	}
	t.Logf("reset times on %s (%s: %s), %d vCPU, %d MiB:", v.Name(), v.Accel(),
		map[Accel]string{AccelTCG: "software emulation", AccelKVM: "hardware virtualisation"}[v.Accel()], cfg.VCPUs, cfg.MemoryMiB)
	keys := make([]string, 0, len(res))
	for k := range res {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		m := res[k]
		line := fmt.Sprintf("  %-24s %s", k, m.summary())
		if len(m.ClockOffset) > 0 {
			line += fmt.Sprintf("; clock offset after restore %.1f..%.1fs; identical %v",
				slices.Min(m.ClockOffset), slices.Max(m.ClockOffset), m.Identical)
		}
		t.Log(line)
	}
	if *measureOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"accel": v.Accel(), "vcpus": cfg.VCPUs, "memory_mib": cfg.MemoryMiB, "results": res}, "", " ")
		if err := os.WriteFile(*measureOut, b, 0o644); err != nil {
			t.Error(err)
		}
	}
}
