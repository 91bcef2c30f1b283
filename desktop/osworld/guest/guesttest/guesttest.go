// Package guesttest runs legato's OSWorld-compatible guest server on the
// host, under an X server of its own, for tests: no VM needed.
//
// Start launches Xvfb on a free display, a window manager (jwm), and the
// guest server from desktop/osworld/testdata/guest on a free 127.0.0.1 port,
// all as children of the test that are killed when it ends. Commands the
// guest runs see HOME set to a fresh directory, `python` on PATH, and the
// pyautogui stand-in on PYTHONPATH, so OSWorld-style actions run as they do
// in a guest VM.
//
// The host needs the Debian packages xvfb, xdotool, wmctrl, jwm, xterm and
// python3; a missing one fails the test with the package's name.
package guesttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"legato/rl/desktop/osworld/guest"
)

// Options configure Start. The zero value is a 1280×720 screen with a window
// manager.
type Options struct {
	// Width and Height are the screen size; zero means 1280×720.
	Width, Height int
	// NoWindowManager leaves the screen without a window manager.
	NoWindowManager bool
	// Timeouts are the client's per-call timeouts.
	Timeouts guest.Timeouts
	// ServerArgs are more arguments for the guest server, such as
	// "--pointer", "osworld".
	ServerArgs []string
	// Env is more environment for the window manager, the guest server
	// and what it runs, such as XCURSOR_THEME=Adwaita.
	Env []string
}

// Guest is a running guest server.
type Guest struct {
	// URL is the server's base URL, on 127.0.0.1.
	URL string
	// Display is the X display, such as ":3".
	Display string
	// Home is HOME for the commands the guest runs.
	Home string
	// Client is a client for URL.
	Client *guest.Client
	// Width and Height are the screen size.
	Width, Height int
}

// tools maps each program the test guest needs to the Debian package that
// has it.
var tools = [][2]string{
	{"Xvfb", "xvfb"}, {"xdotool", "xdotool"}, {"wmctrl", "wmctrl"},
	{"jwm", "jwm"}, {"xterm", "xterm"}, {"python3", "python3"},
}

// Dir returns the directory holding the guest server and the pyautogui
// stand-in (desktop/osworld/testdata/guest).
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "guest")
}

// Start runs a guest server for the test and stops it, with everything it
// started, when the test ends.
func Start(t testing.TB, opts Options) *Guest {
	t.Helper()
	if opts.Width == 0 || opts.Height == 0 {
		opts.Width, opts.Height = 1280, 720
	}
	paths := map[string]string{}
	for _, tool := range tools {
		p, err := exec.LookPath(tool[0])
		if err != nil {
			t.Fatalf("guesttest: %s not found: install the Debian package %s (apt-get install %s)", tool[0], tool[1], tool[1])
		}
		paths[tool[0]] = p
	}
	server := filepath.Join(Dir(), "server.py")
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("guesttest: guest server: %v", err)
	}

	dir := t.TempDir()
	fbdir := filepath.Join(dir, "fb")
	home := filepath.Join(dir, "home")
	bin := filepath.Join(dir, "bin")
	for _, d := range []string{fbdir, home, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// OSWorld runs actions with `python`; Debian only has python3 unless
	// python-is-python3 is installed.
	if err := os.Symlink(paths["python3"], filepath.Join(bin, "python")); err != nil {
		t.Fatal(err)
	}
	// open_file needs an opener whose window is titled after the file.
	opener := filepath.Join(bin, "legato-open")
	script := "#!/bin/sh\nexec xterm -T \"$(basename -- \"$1\") - viewer\" -hold -e cat -- \"$1\"\n"
	if err := os.WriteFile(opener, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	display := startXvfb(t, paths["Xvfb"], fbdir, dir, opts.Width, opts.Height)
	env := append(os.Environ(),
		"DISPLAY="+display,
		"HOME="+home,
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PYTHONPATH="+Dir(),
		"PYTHONDONTWRITEBYTECODE=1",
	)
	env = append(env, opts.Env...)
	if !opts.NoWindowManager {
		startWM(t, paths["jwm"], env, dir)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stderr := logFile(t, dir, "server.log")
	args := append([]string{server, "--host", "127.0.0.1", "--port", "0",
		"--xwd", filepath.Join(fbdir, "Xvfb_screen0"), "--opener", opener,
		"--upload-tmp", dir}, opts.ServerArgs...)
	cmd := exec.Command(paths["python3"], args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, home, w, stderr
	start(t, cmd, "guest server", stderr.Name())
	w.Close()
	line, err := readLine(r, 20*time.Second)
	if err != nil {
		t.Fatalf("guesttest: guest server did not start: %v\n%s", err, tail(stderr.Name()))
	}
	addr, ok := strings.CutPrefix(line, "listening on ")
	if !ok {
		t.Fatalf("guesttest: guest server said %q\n%s", line, tail(stderr.Name()))
	}
	u := "http://" + addr
	c, err := guest.New(u, guest.Options{Timeouts: opts.Timeouts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx, 5*time.Second, 30*time.Second); err != nil {
		t.Fatalf("guesttest: %v\n%s", err, tail(stderr.Name()))
	}
	return &Guest{URL: u, Display: display, Home: home, Client: c, Width: opts.Width, Height: opts.Height}
}

// startXvfb starts Xvfb on a display it picks itself (-displayfd), so tests
// running side by side never collide, and returns the display.
func startXvfb(t testing.TB, xvfb, fbdir, dir string, width, height int) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	log := logFile(t, dir, "xvfb.log")
	cmd := exec.Command(xvfb, "-displayfd", "3", "-screen", "0", fmt.Sprintf("%dx%dx24", width, height),
		"-fbdir", fbdir, "-nolisten", "tcp", "-noreset")
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = log, log, []*os.File{w}
	start(t, cmd, "Xvfb", log.Name())
	w.Close()
	line, err := readLine(r, 20*time.Second)
	if err != nil {
		t.Fatalf("guesttest: Xvfb did not start: %v\n%s", err, tail(log.Name()))
	}
	if _, err := strconv.Atoi(line); err != nil {
		t.Fatalf("guesttest: Xvfb display %q: %v", line, err)
	}
	return ":" + line
}

// systemJWMRC is Debian's jwm configuration; jwmClocks matches its clocks.
const systemJWMRC = "/etc/jwm/system.jwmrc"

var jwmClocks = regexp.MustCompile(`(?s)<Swallow[^>]*>xclock</Swallow>|<Clock[ >].*?</Clock>`)

// startWM starts jwm and waits until it manages the screen.
func startWM(t testing.TB, jwm string, env []string, dir string) {
	t.Helper()
	log := logFile(t, dir, "jwm.log")
	cmd := exec.Command(jwm)
	// The system's configuration shows clocks (the tray's, xclock): on a
	// minute's turn the screen changes under a test that wants it still.
	// jwm gets that configuration less its clocks.
	if rc, err := os.ReadFile(systemJWMRC); err == nil {
		path := filepath.Join(dir, "jwmrc")
		if err := os.WriteFile(path, jwmClocks.ReplaceAll(rc, nil), 0o644); err != nil {
			t.Fatalf("guesttest: %v", err)
		}
		cmd = exec.Command(jwm, "-f", path)
	}
	cmd.Env, cmd.Stdout, cmd.Stderr = env, log, log
	start(t, cmd, "jwm", log.Name())
	// No event says a window manager is ready: poll wmctrl, which fails
	// until one has claimed the screen.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for {
		probe := exec.Command("wmctrl", "-m")
		probe.Env = env
		if probe.Run() == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guesttest: jwm did not manage the screen within 20s\n%s", tail(log.Name()))
		}
		<-tick.C
	}
}

// start starts cmd in a process group of its own and stops the group when
// the test ends: SIGTERM, then SIGKILL if it lingers.
func start(t testing.TB, cmd *exec.Cmd, name, logPath string) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("guesttest: start %s: %v", name, err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		done := make(chan error, 1)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("guesttest: %s ignored SIGTERM; killing it\n%s", name, tail(logPath))
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
		// Whatever the group still holds (a child that ignored SIGTERM).
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
}

func logFile(t testing.TB, dir, name string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// readLine reads one line from r, waiting at most d.
func readLine(r *os.File, d time.Duration) (string, error) {
	if err := r.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !(errors.Is(err, os.ErrDeadlineExceeded) && line != "") {
		return strings.TrimSpace(line), err
	}
	return strings.TrimSpace(line), nil
}

// tail returns the end of a log file, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// WaitWindow blocks until a window whose title matches the regular
// expression name exists and is mapped, and returns its id (decimal, as
// xdotool prints it), at most 20 s. xdotool's search walks the window tree
// and dies of a BadWindow error when a window goes away under it (CI saw
// it right after another test's window closed), so a search that fails is
// tried again, not taken for the answer; --sync would not retry it.
func (g *Guest) WaitWindow(t testing.TB, name string) string {
	t.Helper()
	res := g.run(t, guest.Argv("timeout", "20", "sh", "-c",
		`until xdotool search --onlyvisible --name "$1" 2>/dev/null; do sleep 0.1; done`, "sh", name))
	return strings.Fields(res.Output)[0]
}

// activeWaiter exits 0 once the root window's _NET_ACTIVE_WINDOW is
// argv[1]: it follows the property's changes (xprop -spy) instead of
// polling, since window managers activate windows asynchronously.
const activeWaiter = `import signal, subprocess, sys
p = subprocess.Popen(["xprop", "-root", "-spy", "_NET_ACTIVE_WINDOW"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
def give_up(*_):
    p.kill()
    sys.exit("window %s never became active" % sys.argv[1])
signal.signal(signal.SIGALRM, give_up)
signal.alarm(20)
for line in p.stdout:
    if line.split()[-1] == sys.argv[1]:
        p.kill()
        p.wait()
        sys.exit(0)
give_up()
`

// WaitActive blocks until the window whose title matches the regular
// expression name is the active window, and fails the test if that does not
// happen within 20 s.
func (g *Guest) WaitActive(t testing.TB, name string) {
	t.Helper()
	id, err := strconv.ParseUint(g.WaitWindow(t, name), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	g.run(t, guest.Argv("python3", "-c", activeWaiter, fmt.Sprintf("%#x", id)))
}

func (g *Guest) run(t testing.TB, cmd guest.Command) guest.ExecResult {
	t.Helper()
	res, err := g.Client.Execute(context.Background(), cmd)
	if err != nil {
		t.Fatalf("guesttest: %s: %v", cmd, err)
	}
	if res.ReturnCode != 0 {
		t.Fatalf("guesttest: %s: exit %d: %s", cmd, res.ReturnCode, res.Error)
	}
	return res
}
