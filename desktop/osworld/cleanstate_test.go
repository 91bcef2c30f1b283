package osworld

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest/guesttest"
)

// toolRun runs the clean-state tool on the host, as the desktop runs it in
// a guest.
func toolRun(t *testing.T, cmd string, cfg map[string]any, out any) {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sh", "-c", runTool, "legato", guestTool, filepath.Join(filepath.Dir(cfg["state_dir"].(string)), "py"), guestToolModule, cmd, string(raw))
	var stderr strings.Builder
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		t.Fatalf("clean-state tool %s: %v\n%s", cmd, err, stderr.String())
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("clean-state tool %s: %q: %v", cmd, b, err)
	}
}

// treeState lists a tree: each entry's path, kind, mode, link target and
// file content.
func treeState(t *testing.T, root string) map[string]string {
	t.Helper()
	st := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		v := fi.Mode().String()
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			v += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		st[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sleeper is a sleep the tool may end.
type sleeper struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it ended and was reaped
}

// startSleep starts a sleep with the given display in its environment (or
// none); the test reaps it.
func startSleep(t *testing.T, secs, display string) *sleeper {
	t.Helper()
	c := exec.Command("sleep", secs)
	c.Env = []string{"PATH=" + os.Getenv("PATH")}
	if display != "" {
		c.Env = append(c.Env, "DISPLAY="+display)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sleeper{cmd: c, done: make(chan struct{})}
	go func() { c.Wait(); close(s.done) }()
	t.Cleanup(func() {
		c.Process.Kill()
		<-s.done
	})
	return s
}

// alive reports whether the sleep still runs, waiting a little for one
// that was killed to be reaped. It is for sleeps that must live: under
// load a killed one may take longer to be reaped (then dead says it).
func (s *sleeper) alive() bool { return !endsWithin(s.done, 200*time.Millisecond) }

// dead reports whether the sleep ended, waiting for it as long as a
// loaded machine may take to reap a killed process: for sleeps that must
// have been ended.
func (s *sleeper) dead() bool { return endsWithin(s.done, 30*time.Second) }

// TestCleanStateTool runs the tool on the host against a layout of its own:
// it brings a home and a restored directory back through every kind of
// change (content with the same size and time, new and removed entries,
// modes, link targets, a fifo), ends only the processes in its scope that
// were not there, and reports a change in a checked directory and a
// process of the clean state that is gone.
func TestCleanStateTool(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	root := t.TempDir()
	var b [6]byte
	rand.Read(b[:])
	display := ":legato-test-" + hex.EncodeToString(b[:])
	p := func(s string) string { return filepath.Join(root, s) }
	for _, d := range []string{"home/sub", "tmp/keep", "etc", "state"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, c := range map[string]string{"home/a.txt": "a\n", "home/sub/b.txt": "b\n", "tmp/clean.txt": "clean\n", "tmp/keep/k.txt": "k\n", "etc/conf": "x=1\n"} {
		if err := os.WriteFile(p(f), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("clean.txt", p("tmp/link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p("tmp/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"nonce": "legato-test-" + hex.EncodeToString(b[:]), "home": p("home"), "home_baseline": p("base"),
		"state_dir": p("state"), "restore": []string{p("tmp")}, "check": []string{p("etc")},
		"skip": []string{"/"}, "scope_display": true, "check_outside": true, "display": display,
		"root_desktop": true, // the home is the test's user's: root under CI
	}
	keeper := startSleep(t, "1000", display)
	cleanHome, cleanTmp := treeState(t, p("home")), treeState(t, p("tmp"))
	var rec recordResult
	toolRun(t, "record", cfg, &rec)
	if rec.HomeBaseline != "created" || rec.Kept || rec.Processes != 1 || rec.Windows != nil {
		t.Errorf("record: %+v; want a new baseline, the sleep, and no windows (no X here)", rec)
	}
	// The record left the tool compiled: a call imports it, whatever text
	// comes with it.
	c := exec.Command("sh", "-c", runTool, "legato", "raise SystemExit(9)", filepath.Join(root, "py"), guestToolModule, "quiet", "0")
	if out, err := c.Output(); err != nil || !strings.Contains(string(out), `"load"`) {
		t.Errorf("the tool from its compiled copy: %q, %v; want the probe's answer", out, err)
	}

	// An attempt's changes.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(p("home/a.txt"), []byte("A\n"), 0o644))
	must(os.WriteFile(p("home/new.txt"), []byte("new\n"), 0o644))
	must(os.RemoveAll(p("home/sub")))
	st, err := os.Stat(p("tmp/clean.txt"))
	must(err)
	// Same size, same time: only the ctime shows it.
	must(os.WriteFile(p("tmp/clean.txt"), []byte("dirty\n"), 0o644))
	must(os.Chtimes(p("tmp/clean.txt"), st.ModTime(), st.ModTime()))
	must(os.WriteFile(p("tmp/left.txt"), []byte("left\n"), 0o644))
	must(os.MkdirAll(p("tmp/dir/deep"), 0o755))
	must(os.WriteFile(p("tmp/dir/deep/x"), []byte("x\n"), 0o644))
	must(os.Remove(p("tmp/fifo")))
	must(os.Chmod(p("tmp/keep"), 0o700))
	must(os.Remove(p("tmp/link")))
	must(os.Symlink("elsewhere", p("tmp/link")))
	newcomer := startSleep(t, "999", display)
	outsider := startSleep(t, "998", "")

	var res cleanResult
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 {
		t.Errorf("reset: problems %q, broken %q; want none", res.Problems, res.Broken)
	}
	if diff := cmp.Diff(cleanHome, treeState(t, p("home"))); diff != "" {
		t.Errorf("home after the reset (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(cleanTmp, treeState(t, p("tmp"))); diff != "" {
		t.Errorf("restored directory after the reset (-want +got):\n%s", diff)
	}
	if !newcomer.dead() || !keeper.alive() || !outsider.alive() {
		t.Errorf("after the reset: newcomer alive %v (want false), clean-state sleep %v, sleep of another display %v (want true)",
			newcomer.alive(), keeper.alive(), outsider.alive())
	}
	if len(res.Ended) != 1 || res.Ended[0].Name != "sleep" || res.Ended[0].PID != newcomer.cmd.Process.Pid {
		t.Errorf("ended %+v; want the one newcomer", res.Ended)
	}

	// A second reset finds nothing to do: the rewritten file's new ctime
	// is the clean state now.
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || res.Restored[p("tmp")] != 0 {
		t.Errorf("second reset: problems %q, restored %v; want nothing", res.Problems, res.Restored)
	}

	// What it cannot undo: a change in a checked directory, a process of
	// the clean state that is gone.
	time.Sleep(10 * time.Millisecond)
	must(os.WriteFile(p("etc/conf"), []byte("x=2\n"), 0o644))
	keeper.cmd.Process.Kill()
	<-keeper.done
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	got := strings.Join(res.Problems, "\n")
	for _, want := range []string{"changed outside what a fast reset restores: " + p("etc/conf"), "processes of the clean state are gone: sleep (pid "} {
		if !strings.Contains(got, want) {
			t.Errorf("problems:\n%s\nwant one containing %q", got, want)
		}
	}

	// Through the helper: the record starts it, and it serves resets and
	// probes without sudo or Python's start, as root.
	cfg["helper"], cfg["cache"] = p("helper"), p("py")
	var started struct {
		HelperPID int `json:"helper_pid"`
	}
	toolRun(t, "record", cfg, &started)
	if started.HelperPID == 0 {
		t.Fatal("the record started no helper")
	}
	t.Cleanup(func() { syscall.Kill(started.HelperPID, syscall.SIGKILL) })
	call := func(cmd, arg string, out any) {
		t.Helper()
		nonce := newNonce()
		req, _ := json.Marshal(map[string]string{"cmd": cmd, "arg": arg, "nonce": nonce})
		c := exec.Command("sh", "-c", helperCall, "legato", p("helper"), nonce, string(req))
		b, err := c.Output()
		if err != nil {
			t.Fatalf("helper %s: %v: %s", cmd, err, b)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("helper %s: %q: %v", cmd, b, err)
		}
	}
	must(os.WriteFile(p("tmp/helper-left.txt"), []byte("x\n"), 0o644))
	newcomer = startSleep(t, "997", display)
	res = cleanResult{}
	call("reset", "", &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 || !newcomer.dead() || len(res.Ended) != 1 {
		t.Errorf("reset through the helper: %+v, newcomer alive %v; want it ended and nothing left", res, newcomer.alive())
	}
	if _, err := os.Stat(p("tmp/helper-left.txt")); !os.IsNotExist(err) {
		t.Errorf("reset through the helper left tmp/helper-left.txt: %v", err)
	}
	// What the call's shell starts is the call's, though its own
	// arguments do not name the nonce (one caught in exec shows none): the
	// reset spares it. Here, a sleep of the desktop's display that outlives
	// the call.
	pidFile := p("call-child.pid")
	nonce := newNonce()
	req, _ := json.Marshal(map[string]string{"cmd": "reset", "arg": "", "nonce": nonce})
	c = exec.Command("sh", "-c", `sleep 300 >/dev/null 2>&1 & echo $! >"$4"; `+helperCall, "legato", p("helper"), nonce, string(req), pidFile)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "DISPLAY=" + display}
	out, err := c.Output()
	var child int
	if b, rerr := os.ReadFile(pidFile); rerr == nil {
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if child > 0 {
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	}
	res = cleanResult{}
	if err != nil || json.Unmarshal(out, &res) != nil {
		t.Fatalf("reset through the helper from a shell that started a child: %v: %s", err, out)
	}
	if child == 0 || syscall.Kill(child, 0) != nil || len(res.Ended) != 0 {
		t.Errorf("a reset whose caller's shell started pid %d ended %+v (child alive: %v); want the call's own child spared", child, res.Ended, child > 0 && syscall.Kill(child, 0) == nil)
	}

	var q quietProbe
	call("quiet", "0.05", &q)
	if q.Damage != nil || q.Why == "" || q.Load < 0 || q.Load > 1 {
		t.Errorf("quiet probe through the helper: %+v; want a load and why there is no screen", q)
	}
	must(os.Remove(filepath.Join(p("state"), "clean.json")))
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	if len(res.Broken) != 1 || !strings.Contains(res.Broken[0], "no clean-state record") {
		t.Errorf("reset without a record: broken %q; want it named", res.Broken)
	}
}

// startSleepAs starts a sleep as uid (and gid uid) with the given display
// in its environment; the test reaps it.
func startSleepAs(t *testing.T, uid int, secs, display string) *sleeper {
	t.Helper()
	c := exec.Command("sleep", secs)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "DISPLAY=" + display}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sleeper{cmd: c, done: make(chan struct{})}
	go func() { c.Wait(); close(s.done) }()
	t.Cleanup(func() {
		c.Process.Kill()
		<-s.done
	})
	return s
}

// vmToolLayout makes home, tmp and state directories for the tool and its
// configuration as a dedicated VM's desktop has it, scoped to a display of
// the test's own.
func vmToolLayout(t *testing.T) (cfg map[string]any, display string) {
	t.Helper()
	root := t.TempDir()
	var b [6]byte
	rand.Read(b[:])
	display = ":legato-test-" + hex.EncodeToString(b[:])
	p := func(s string) string { return filepath.Join(root, s) }
	for _, d := range []string{"home", "tmp", "state"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]any{
		"nonce": "legato-test-" + hex.EncodeToString(b[:]), "home": p("home"), "home_baseline": p("base"),
		"state_dir": p("state"), "restore": []string{p("tmp")}, "check": []string{},
		"skip": []string{"/"}, "display": display, "dedicated": true, "scope_display": true, "vm": true,
	}, display
}

// TestCleanStateToolLetsSystemWorkersComeAndGo: root's udev workers that
// end after the record, and new ones, are no sign of the attempt on a VM.
func TestCleanStateToolLetsSystemWorkersComeAndGo(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: udev's workers run as root")
	}
	cfg, display := vmToolLayout(t)
	// A worker is a program whose name (comm) is "(udev-worker)".
	worker := sleepNamed(t, "(udev-worker)")
	start := func(secs string) *exec.Cmd {
		c := exec.Command(worker, secs)
		c.Env = []string{"DISPLAY=" + display}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	old := start("990")
	keeper := startSleepAs(t, 0, "991", display) // a process of the clean state that stays
	var rec recordResult
	toolRun(t, "record", cfg, &rec)
	if rec.Refused != "" || rec.Processes != 1 {
		t.Fatalf("record: %+v; want the sleep alone recorded, not the worker", rec)
	}
	old.Process.Kill()
	old.Wait()
	start("989")
	var res cleanResult
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 || len(res.Ended) > 0 || !keeper.alive() {
		t.Errorf("reset: problems %q, broken %q, ended %+v, the clean state's sleep alive %v; want no problem, nothing ended",
			res.Problems, res.Broken, res.Ended, keeper.alive())
	}
}

// TestCleanStateToolDropsLingeringConnections: a connection its program
// closed first stays in TIME-WAIT on the program's port, which a program
// that listens there again without SO_REUSEADDR cannot bind; the reset
// drops those on the forwarded ports it is given, and only there.
func TestCleanStateToolDropsLingeringConnections(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("ss (iproute2) not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: dropping sockets does")
	}
	// timeWait leaves a TIME-WAIT socket on a listener's port and returns
	// the port: the listener's side closes first.
	timeWait := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		io.Copy(io.Discard, c) // until the FIN: the server's side is now in TIME-WAIT or on its way
		return ln.Addr().(*net.TCPAddr).Port
	}
	lingers := func(port int) bool {
		out, err := exec.Command("ss", "-t", "-n", "-H", "state", "time-wait", fmt.Sprintf("( sport = :%d )", port)).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out)) != ""
	}
	forwarded, other := timeWait(), timeWait()
	if !lingers(forwarded) || !lingers(other) {
		t.Fatalf("no TIME-WAIT sockets on ports %d and %d to drop; the test cannot tell", forwarded, other)
	}
	cfg, _ := vmToolLayout(t)
	cfg["forwarded_ports"] = []int{forwarded}
	var rec recordResult
	toolRun(t, "record", cfg, &rec)
	var res struct {
		cleanResult
		Dropped int `json:"dropped_connections"`
	}
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 || res.Dropped < 1 {
		t.Errorf("reset: problems %q, broken %q, dropped %d; want none, none, at least 1", res.Problems, res.Broken, res.Dropped)
	}
	if lingers(forwarded) {
		t.Errorf("a TIME-WAIT socket is left on the forwarded port %d", forwarded)
	}
	if !lingers(other) {
		t.Errorf("the TIME-WAIT socket on port %d, not forwarded, was dropped too", other)
	}
}

// TestCleanStateToolEndsOnlyTheDesktopsProcesses: a fast reset ends the
// processes of the desktop's user (the home's owner) started since the
// clean state, and leaves another user's and root's alone, naming them
// (on a VM of legato's they are left of the attempt: a problem, so that
// the desktop loads its snapshot). A guest not known to be dedicated that
// runs another regular user's processes is refused, by the record and by
// the reset, before anything is ended.
func TestCleanStateToolEndsOnlyTheDesktopsProcesses(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the processes run as other users")
	}
	const desktopUID, otherUID = 47011, 47012
	root := t.TempDir()
	// The other users must reach sleep's directory; t.TempDir's parent is
	// 0700 under some TMPDIRs, so the layout lives in a directory of its own.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	display := ":legato-test-" + hex.EncodeToString(b[:])
	p := func(s string) string { return filepath.Join(root, s) }
	for _, d := range []string{"home", "tmp", "state"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(p("home"), desktopUID, desktopUID); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"nonce": "legato-test-" + hex.EncodeToString(b[:]), "home": p("home"), "home_baseline": p("base"),
		"state_dir": p("state"), "restore": []string{p("tmp")}, "check": []string{},
		"skip": []string{"/"}, "display": display,
	}

	// Not said to be dedicated, another regular user's process running: the
	// record refuses, naming it. (Without the display scope: the host's
	// other processes are in view, as on a shared machine; a record ends
	// nothing.)
	stranger := startSleepAs(t, otherUID, "996", display)
	var rec recordResult
	toolRun(t, "record", cfg, &rec)
	if !strings.Contains(rec.Refused, "--guest-dedicated") || !strings.Contains(rec.Refused, "uid "+strconv.Itoa(otherUID)) {
		t.Errorf("record on a guest with another user's process: refused %q; want it refused, naming the user and --guest-dedicated", rec.Refused)
	}
	cfg["dedicated"] = true
	cfg["scope_display"] = true
	rec = recordResult{}
	toolRun(t, "record", cfg, &rec)
	if rec.Refused != "" || rec.Processes != 1 {
		t.Fatalf("record on a dedicated guest: %+v; want the stranger's sleep recorded", rec)
	}

	mine := startSleepAs(t, desktopUID, "999", display)
	other := startSleepAs(t, otherUID, "998", display)
	system := startSleepAs(t, 0, "997", display)
	var res cleanResult
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 {
		t.Errorf("reset: problems %q, broken %q; want none", res.Problems, res.Broken)
	}
	if !mine.dead() || !other.alive() || !system.alive() || !stranger.alive() {
		t.Errorf("after the reset: the desktop user's sleep alive %v (want false), another user's %v, root's %v, the clean state's %v (want true)",
			mine.alive(), other.alive(), system.alive(), stranger.alive())
	}
	want := []desktop.Process{{PID: mine.cmd.Process.Pid, Name: "sleep", UID: desktopUID}}
	if diff := cmp.Diff(want, res.Ended); diff != "" {
		t.Errorf("ended (-want +got):\n%s", diff)
	}
	spared := []desktop.Process{{PID: other.cmd.Process.Pid, Name: "sleep", UID: otherUID}, {PID: system.cmd.Process.Pid, Name: "sleep", UID: 0}}
	slices.SortFunc(spared, func(a, b desktop.Process) int { return a.PID - b.PID })
	if diff := cmp.Diff(spared, res.Spared); diff != "" {
		t.Errorf("spared (-want +got):\n%s", diff)
	}

	// On a VM of legato's, what it must leave running is left of the
	// attempt.
	cfg["vm"] = true
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	if got := strings.Join(res.Problems, "\n"); !strings.Contains(got, "not the desktop user's") || !other.alive() || !system.alive() {
		t.Errorf("reset on a VM: problems %q, another user's sleep alive %v, root's %v; want them named as left and alive", got, other.alive(), system.alive())
	}

	// The reset refuses as the record does, and ends nothing.
	cfg["vm"], cfg["dedicated"], cfg["scope_display"] = false, false, false
	mine = startSleepAs(t, desktopUID, "995", display)
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	if len(res.Broken) != 1 || !strings.Contains(res.Broken[0], "--guest-dedicated") || len(res.Ended) != 0 || !mine.alive() {
		t.Errorf("reset on a guest that looks shared: broken %q, ended %+v, the desktop user's sleep alive %v; want refused, nothing ended", res.Broken, res.Ended, mine.alive())
	}
}

// TestProcessFate decides, in the guest tool's one place for it (fate in
// guestpy/cleanstate.py), what a fast reset does with each kind of process
// started since the clean state, on a table of processes as a GNOME guest
// has them: the guest server a service of its own, the X server in the
// login session, the user manager apart.
func TestProcessFate(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	const login = "/user.slice/user-1000.slice/session-2.scope"
	type proc struct {
		ppid, sid, uid int
		display        bool // its environment names the desktop's display
		cgroup         string
		clean          bool // there at the clean state
	}
	procs := map[int]proc{
		1:   {0, 0, 0, false, "/init.scope", true},
		100: {1, 100, 1000, true, "/system.slice/osworld-server.service", true}, // the guest server
		190: {1, 190, 1000, false, login, true},                                 // gdm-x-session, the login's leader
		200: {190, 190, 1000, false, login, true},                               // Xorg
		300: {1, 300, 1000, false, "/user.slice/user-1000.slice/user@1000.service/init.scope", true},
		400: {1, 400, 0, false, "/system.slice/cron.service", true},

		101: {100, 100, 1000, false, "/system.slice/osworld-server.service", false},
		102: {100, 102, 1000, false, "/system.slice/osworld-server.service", false},
		103: {1, 100, 1000, false, "/system.slice/osworld-server.service", false},
		104: {1, 104, 1000, true, "/", false},
		105: {1, 105, 1000, false, login + "/sub", false},
		106: {1, 106, 1000, false, "/user.slice/user-1000.slice/session-5.scope", false},
		107: {106, 106, 1000, false, "/user.slice/user-1000.slice/session-5.scope", false},
		108: {300, 108, 1000, false, "/user.slice/user-1000.slice/user@1000.service/app.slice/x.service", false},
		109: {300, 109, 1000, true, "/user.slice/user-1000.slice/user@1000.service/app.slice/y.service", false},
		110: {400, 400, 0, false, "/system.slice/cron.service", false},
		111: {101, 100, 0, false, "/system.slice/osworld-server.service", false},
		112: {1, 112, 1001, true, "/", false},
		113: {1, 113, 0, true, "/", false},
		114: {113, 113, 1000, false, "/", false},
		115: {1, 115, 1000, false, "/", false},
		116: {115, 116, 1000, false, login, false},
		117: {1, 0, 1000, false, "/", false},
		118: {1, 190, 1000, false, "/", false},
	}
	session := map[string]any{"display": ":0", "display_only": false, "sids": []int{100, 190}, "cgroups": []string{login}}
	// The guest server in PID 1's Unix session (a guest without systemd).
	initSession := map[string]any{"display": ":0", "display_only": false, "sids": []int{0, 190}, "cgroups": []string{login}}
	displayOnly := map[string]any{"display": ":0", "display_only": true, "sids": []int{}, "cgroups": []string{}}
	tests := []struct {
		name    string
		pid     int
		uid     int // the desktop user's
		session map[string]any
		want    string
	}{
		{"child of the guest server, environment cleared", 101, 1000, session, "end"},
		{"child of the guest server in a Unix session of its own", 102, 1000, session, "end"},
		{"orphan still in the guest server's Unix session", 103, 1000, session, "end"},
		{"orphan whose environment names the display", 104, 1000, session, "end"},
		{"orphan in the login session's cgroup", 105, 1000, session, "end"},
		{"same user, another login", 106, 1000, session, "outside"},
		{"started in another login", 107, 1000, session, "outside"},
		{"same user, the user manager's, no display", 108, 1000, session, "outside"},
		{"the user manager's, naming the display", 109, 1000, session, "end"},
		{"root's cron job", 110, 1000, session, "shared"},
		{"sudo of the session's user", 111, 1000, session, "end"},
		{"another user's naming the display", 112, 1000, session, "spare"},
		{"root's naming the display, not started by the user", 113, 1000, session, "spare"},
		{"the user's, started by root's in the session", 114, 1000, session, "end"},
		{"same user, adopted by PID 1, nothing of the session", 115, 1000, session, "outside"},
		{"a process that moved into the login session", 116, 1000, session, "end"},
		{"adopted, in PID 1's Unix session, which is no anchor's", 117, 1000, session, "outside"},
		{"anchor in PID 1's Unix session: adopted, in that session too", 117, 1000, initSession, "outside"},
		{"anchor in PID 1's Unix session: adopted, in another anchor's", 118, 1000, initSession, "end"},
		{"root desktop: root's outside the session", 110, 0, session, "shared"},
		{"root desktop: root's of the session", 113, 0, session, "end"},
		{"root desktop: root's sudo in the session", 111, 0, session, "end"},
		{"display only: child of a process naming it", 101, 1000, displayOnly, "end"},
		{"display only: the guest server's Unix session is not the scope", 103, 1000, displayOnly, "outside"},
		{"display only: the login session is not the scope", 105, 1000, displayOnly, "outside"},
		{"display only: naming the display", 104, 1000, displayOnly, "end"},
	}
	type row struct {
		Procs   map[int][]any  `json:"procs"`
		Facts   map[int][]any  `json:"facts"`
		Base    []string       `json:"base"`
		Session map[string]any `json:"session"`
		UID     int            `json:"uid"`
		PID     int            `json:"pid"`
	}
	var rows []row
	for _, tt := range tests {
		r := row{Procs: map[int][]any{}, Facts: map[int][]any{}, Session: tt.session, UID: tt.uid, PID: tt.pid}
		for pid, p := range procs {
			// (start, ppid, state, uid, comm, flags, sid); the start is the pid.
			r.Procs[pid] = []any{pid, p.ppid, "S", p.uid, "p" + strconv.Itoa(pid), 0, p.sid}
			r.Facts[pid] = []any{p.ppid, p.sid, p.display, p.cgroup}
			if p.clean {
				r.Base = append(r.Base, fmt.Sprintf("%d:%d", pid, pid))
			}
		}
		rows = append(rows, r)
	}
	in, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	const driver = `
import json, sys
g = {"__name__": "legato_guest"}
exec(compile(sys.argv[1], "legato_guest", "exec"), g)
out = []
for r in json.load(sys.stdin):
    procs = {int(p): tuple(v) for p, v in r["procs"].items()}
    facts = {int(p): tuple(v) for p, v in r["facts"].items()}
    out.append(g["fate"](r["pid"], procs, facts, r["session"], r["uid"], set(r["base"])))
print(json.dumps(out))
`
	c := exec.Command("python3", "-I", "-S", "-c", driver, guestTool)
	c.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		t.Fatalf("fate: %v\n%s", err, stderr.String())
	}
	var got []string
	if err := json.Unmarshal(b, &got); err != nil || len(got) != len(tests) {
		t.Fatalf("fate: %q: %v; want %d answers", b, err, len(tests))
	}
	for i, tt := range tests {
		if got[i] != tt.want {
			t.Errorf("%s (pid %d, desktop uid %d): %q, want %q", tt.name, tt.pid, tt.uid, got[i], tt.want)
		}
	}
}

// orphan is a process of the test's that PID 1 adopted: it left the test's
// process tree, as a program that daemonizes does.
type orphan struct {
	proc *os.Process // a pidfd where the kernel has them: never another process
	done chan struct{}
}

// startOrphan runs the shell script in a Unix session of its own, with an
// environment of PATH alone. The script starts the orphan in the
// background, with file descriptor 3 open and its standard output
// elsewhere, prints its pid ($!) and exits; the pipe on descriptor 3
// closes when the orphan ends.
func startOrphan(t *testing.T, script string) *orphan {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sh", "-c", script)
	c.Env = []string{"PATH=" + os.Getenv("PATH")}
	c.ExtraFiles = []*os.File{w}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := c.Output()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("start an orphan: %v", err)
	}
	return newOrphan(t, strings.TrimSpace(string(out)), r)
}

// newOrphan watches the orphan of pid (text) whose end closes r.
func newOrphan(t *testing.T, pid string, r *os.File) *orphan {
	t.Helper()
	n, err := strconv.Atoi(pid)
	if err != nil {
		r.Close()
		t.Fatalf("an orphan's pid: %q", pid)
	}
	// The orphan runs (its end of the pipe is open): the handle is its.
	p, err := os.FindProcess(n)
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	o := &orphan{proc: p, done: make(chan struct{})}
	go func() {
		io.Copy(io.Discard, r)
		r.Close()
		close(o.done)
	}()
	t.Cleanup(func() {
		o.proc.Kill()
		<-o.done
		o.proc.Release()
	})
	return o
}

// toolSession is the script of a stand-in guest server: a shell in a Unix
// session of its own that runs the tool's record ($1 its runner, $2 its
// text, $3 its cache, $4 its module) with the configuration it reads from
// its input (not in its arguments: a guest server does not carry the
// call's nonce), prints the answer on a line, then leaves in its session a
// sleep with an empty environment, which PID 1 adopts, prints its pid, and
// runs until its input closes.
const toolSession = `read -r cfg
sh -c "$1" legato "$2" "$3" "$4" record "$cfg" || exit
echo
(env -i sleep 996 </dev/null >/dev/null 2>&1 & echo $!)
exec 3>&-
read -r _`

// recordInSession records the clean state through a stand-in guest server
// (toolSession), which runs until the test ends, and returns the record's
// answer and the sleep it left in its session.
func recordInSession(t *testing.T, cfg map[string]any) (string, *orphan) {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(filepath.Dir(cfg["state_dir"].(string)), "py")
	c := exec.Command("sh", "-c", toolSession, "legato-guest-server", runTool, guestTool, cache, guestToolModule)
	c.Env = []string{"PATH=" + os.Getenv("PATH")}
	c.ExtraFiles = []*os.File{w}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var stderr strings.Builder
	c.Stderr = &stderr
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		in.Close()
		c.Wait()
	})
	if _, err := fmt.Fprintf(in, "%s\n", raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	answer, err := br.ReadString('\n')
	if err != nil {
		r.Close()
		t.Fatalf("record through a stand-in guest server: %v\n%s", err, stderr.String())
	}
	pid, err := br.ReadString('\n')
	if err != nil {
		r.Close()
		t.Fatalf("the stand-in guest server's sleep: %v\n%s", err, stderr.String())
	}
	return answer, newOrphan(t, strings.TrimSpace(pid), r)
}

// alive and dead wait as a sleeper's do.
func (o *orphan) alive() bool { return !endsWithin(o.done, 200*time.Millisecond) }
func (o *orphan) dead() bool  { return endsWithin(o.done, 30*time.Second) }

// endsWithin reports whether done is closed (the process ended) within d.
func endsWithin(done chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// inLoginSession reports whether this process runs in a systemd login
// session's cgroup: a guest server started here would make the whole login
// the desktop's session.
func inLoginSession(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return regexp.MustCompile(`/user-\d+\.slice/session-[^/]+\.scope`).Match(b)
}

// TestCleanStateToolEndsOnlyTheSessionsProcesses: a fast reset ends the
// processes of the desktop's session started since the clean state, those
// whose environment names its display and those left in the guest server's
// Unix session (an empty environment, adopted by PID 1), and spares a
// process of the same user outside it (an empty environment, a session of
// its own, adopted by PID 1), even on a guest said to be dedicated. Not
// dedicated, that process, root's, makes the guest look shared: the reset
// refuses, naming it, and ends nothing.
func TestCleanStateToolEndsOnlyTheSessionsProcesses(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	if inLoginSession(t) {
		t.Skip("runs in a systemd login session: the whole login would be the test desktop's session, and its processes the reset's to end")
	}
	cfg, display := vmToolLayout(t)
	cfg["vm"], cfg["scope_display"], cfg["root_desktop"] = false, false, os.Geteuid() == 0
	out, session := recordInSession(t, cfg)
	var rec recordResult
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("record: %q: %v", out, err)
	}
	if rec.Refused != "" {
		t.Fatalf("record: refused %q", rec.Refused)
	}
	if len(rec.Session) != 1 || rec.Session[0].What != "guest server" {
		t.Errorf("record: session %+v; want the stand-in guest server its one anchor (no X server here)", rec.Session)
	}
	outsider := startOrphan(t, `env -i sleep 995 </dev/null >/dev/null 2>&1 &
echo $!`)
	shows := startSleep(t, "994", display)

	var res cleanResult
	toolRun(t, "reset", cfg, &res)
	if len(res.Problems) > 0 || len(res.Broken) > 0 {
		t.Errorf("reset: problems %q, broken %q; want none", res.Problems, res.Broken)
	}
	if !session.dead() || !shows.dead() || !outsider.alive() {
		t.Errorf("after the reset: the sleep left in the guest server's session alive %v, the one naming the display %v (want false), the same user's outside the session %v (want true)",
			session.alive(), shows.alive(), outsider.alive())
	}
	if !slices.ContainsFunc(res.Spared, func(p desktop.Process) bool { return p.PID == outsider.proc.Pid }) {
		t.Errorf("spared %+v; want the outsider (pid %d) named", res.Spared, outsider.proc.Pid)
	}

	if os.Geteuid() != 0 {
		return // the outsider is root's only when the test is
	}
	cfg["dedicated"] = false
	shows = startSleep(t, "993", display)
	res = cleanResult{}
	toolRun(t, "reset", cfg, &res)
	broken := strings.Join(res.Broken, "\n")
	if !strings.Contains(broken, "root's processes started since the clean state outside the desktop's session") ||
		!strings.Contains(broken, "--guest-dedicated") || len(res.Ended) != 0 || !shows.alive() || !outsider.alive() {
		t.Errorf("reset of a guest not said to be dedicated, root's sleep outside the session: broken %q, ended %+v, the session's sleep alive %v, the outsider %v; want it refused for root's process, naming --guest-dedicated, nothing ended",
			broken, res.Ended, shows.alive(), outsider.alive())
	}
}

// TestCleanStateToolRefusesARootDesktop: a guest given by URL whose desktop
// user is root is refused unless said to be (--guest-root-desktop); a VM of
// legato's is not.
func TestCleanStateToolRefusesARootDesktop(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the desktop's home is root's")
	}
	cfg, _ := vmToolLayout(t)
	cfg["vm"] = false
	var rec recordResult
	toolRun(t, "record", cfg, &rec)
	if !strings.Contains(rec.Refused, "is root") || !strings.Contains(rec.Refused, "--guest-root-desktop") {
		t.Errorf("record of a root desktop by URL: refused %q; want it refused, naming --guest-root-desktop", rec.Refused)
	}
	for _, c := range []struct {
		name     string
		vm, root bool
	}{{"told", false, true}, {"a VM", true, false}} {
		cfg["vm"], cfg["root_desktop"] = c.vm, c.root
		rec = recordResult{}
		toolRun(t, "record", cfg, &rec)
		if rec.Refused != "" {
			t.Errorf("record of a root desktop, %s: refused %q; want it recorded", c.name, rec.Refused)
		}
	}
	cfg["vm"], cfg["root_desktop"] = false, false
	var res cleanResult
	toolRun(t, "reset", cfg, &res)
	if len(res.Broken) != 1 || !strings.Contains(res.Broken[0], "--guest-root-desktop") {
		t.Errorf("reset of a root desktop by URL: broken %q; want it refused, naming --guest-root-desktop", res.Broken)
	}
}

// TestCleanStateRecordFindsTheDesktopsSession: the record takes for the
// desktop's session those of the guest server that runs it, of the X
// server that listens on the display and of the window manager that
// manages it.
func TestCleanStateRecordFindsTheDesktopsSession(t *testing.T) {
	g := guesttest.Start(t, guesttest.Options{})
	cfg, _ := vmToolLayout(t)
	cfg["display"], cfg["scope_display"] = g.Display, false
	out, _ := recordInSession(t, cfg)
	var rec recordResult
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("record: %q: %v", out, err)
	}
	var got []string
	for _, a := range rec.Session {
		got = append(got, a.What+" "+a.Name)
	}
	if diff := cmp.Diff([]string{"guest server sh", "X server Xvfb", "window manager jwm"}, got); diff != "" {
		t.Errorf("the session's anchors (-want +got):\n%s\nrecord: %+v", diff, rec)
	}
}

// TestEndNewcomersForgetsWhatItKilled: a process the reset killed may show
// once more before it is gone, and then, its parent ended and its
// environment unreadable, look outside the desktop's session. It was ended:
// the reset must not report it left running (which failed a fast reset of
// a terminal whose shell outlived its xterm by a moment, and fell back to
// a snapshot load). A process outside the session that the reset never
// killed is still reported.
func TestEndNewcomersForgetsWhatItKilled(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	const driver = `
import json, sys, types
g = {"__name__": "legato_guest"}
exec(compile(sys.argv[1], "legato_guest", "exec"), g)
sh = (500, 1, "S", 1000, "sh", 0, 217)
other = (600, 1, "S", 1000, "cron-job", 0, 300)
looks = [({217: sh}, {}), ({}, {217: sh})]
if sys.argv[2] == "outside":
    looks = [({217: sh}, {}), ({}, {217: sh, 300: other})]
def newcomers(cfg, base, session):
    new, left = looks.pop(0)
    return new, left, {}, set()
g["newcomers"] = newcomers
g["os"] = types.SimpleNamespace(kill=lambda pid, sig: None)
problems = g["Problems"]()
ended, spared = g["end_newcomers"]({"vm": True}, {}, {}, problems, float("inf"))
print(json.dumps({"ended": [e["pid"] for e in ended], "spared": [e["pid"] for e in spared],
                  "problems": list(problems)}))
`
	for _, tt := range []struct {
		look        string
		wantSpared  []int
		wantProblem bool
	}{
		{"killed", nil, false},
		{"outside", []int{300}, true},
	} {
		c := exec.Command("python3", "-I", "-S", "-c", driver, guestTool, tt.look)
		var stderr strings.Builder
		c.Stderr = &stderr
		b, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tt.look, err, stderr.String())
		}
		var got struct {
			Ended, Spared []int
			Problems      []string
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %q: %v", tt.look, b, err)
		}
		if diff := cmp.Diff([]int{217}, got.Ended); diff != "" {
			t.Errorf("%s: ended (-want +got):\n%s", tt.look, diff)
		}
		if diff := cmp.Diff(tt.wantSpared, got.Spared, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: spared (-want +got):\n%s", tt.look, diff)
		}
		if has := len(got.Problems) > 0; has != tt.wantProblem {
			t.Errorf("%s: problems %q; want some: %v", tt.look, got.Problems, tt.wantProblem)
		}
	}
}
