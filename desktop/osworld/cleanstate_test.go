package osworld

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
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
func (s *sleeper) alive() bool { return !s.endsWithin(200 * time.Millisecond) }

// dead reports whether the sleep ended, waiting for it as long as a
// loaded machine may take to reap a killed process: for sleeps that must
// have been ended.
func (s *sleeper) dead() bool { return s.endsWithin(30 * time.Second) }

// endsWithin reports whether the sleep ends (or has ended) within d.
func (s *sleeper) endsWithin(d time.Duration) bool {
	select {
	case <-s.done:
		return true
	case <-time.After(d):
		return false
	}
}

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
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	worker := filepath.Join(t.TempDir(), "(udev-worker)")
	if err := os.WriteFile(worker, data, 0o755); err != nil {
		t.Fatal(err)
	}
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
