package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/guest/guesttest"
)

// These tests run the client against legato's guest server on the host,
// under Xvfb: every endpoint, and pyautogui actions that move the real X
// pointer and type real text into a real terminal.

func exec(t *testing.T, c *guest.Client, cmd guest.Command) guest.ExecResult {
	t.Helper()
	res, err := c.Execute(context.Background(), cmd)
	if err != nil {
		t.Fatalf("execute %s: %v", cmd, err)
	}
	if res.ReturnCode != 0 {
		t.Fatalf("execute %s: exit %d: %s", cmd, res.ReturnCode, res.Error)
	}
	return res
}

func TestHostGuest(t *testing.T) {
	g := guesttest.Start(t, guesttest.Options{})
	c := g.Client
	ctx := context.Background()

	t.Run("screenshot", func(t *testing.T) {
		shot, err := c.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(shot.PNG))
		if err != nil {
			t.Fatal(err)
		}
		got := []int{shot.Width, shot.Height, img.Bounds().Dx(), img.Bounds().Dy()}
		if diff := cmp.Diff([]int{g.Width, g.Height, g.Width, g.Height}, got); diff != "" {
			t.Errorf("size (-want +got):\n%s", diff)
		}
	})

	t.Run("screen size", func(t *testing.T) {
		w, h, err := c.ScreenSize(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]int{g.Width, g.Height}, []int{w, h}); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})

	t.Run("execute", func(t *testing.T) {
		tests := []struct {
			name string
			cmd  guest.Command
			want guest.ExecResult
		}{
			{"argv", guest.Argv("echo", "a b", "c"), guest.ExecResult{Status: "success", Output: "a b c\n"}},
			{"line split like a shell", guest.Command{Line: `printf '%s|' 'a b' "c"`},
				guest.ExecResult{Status: "success", Output: "a b|c|"}},
			{"shell line", guest.ShellLine("echo out; echo err >&2; exit 3"),
				guest.ExecResult{Status: "success", Output: "out\n", Error: "err\n", ReturnCode: 3}},
			{"home expanded", guest.Argv("ls", "-d", "~/"), guest.ExecResult{Status: "success", Output: g.Home + "/\n"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := c.Execute(ctx, tt.cmd)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				got, err = c.SetupExecute(ctx, tt.cmd)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("setup/execute (-want +got):\n%s", diff)
				}
			})
		}
		_, err := c.Execute(ctx, guest.Argv("no-such-program-here"))
		var ge *guest.Error
		if !errors.As(err, &ge) || ge.Status != 500 || guest.IsNotReady(err) {
			t.Errorf("missing program: error = %v, want a 500 from the guest", err)
		}
	})

	t.Run("pyautogui moves the X pointer", func(t *testing.T) {
		res, err := c.RunPyautogui(ctx, "pyautogui.moveTo(321, 234); print(pyautogui.position())")
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("run: %v %+v", err, res)
		}
		x, y, err := c.CursorPosition(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Ask X itself too, not only the server.
		loc := exec(t, c, guest.Argv("xdotool", "getmouselocation", "--shell")).Output
		got := []string{fmt.Sprint(x, y), res.Output, strings.Join(strings.Fields(loc)[:2], " ")}
		want := []string{"321 234", "Point(x=321, y=234)\n", "X=321 Y=234"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		// The screenshot shows the pointer where X has it: the arrow's
		// black tip at the hot spot, white inside.
		shot, err := c.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		img, _ := png.Decode(bytes.NewReader(shot.PNG))
		r1, _, _, _ := img.At(321, 234).RGBA()
		r2, _, _, _ := img.At(322, 236).RGBA()
		if r1 != 0 || r2 != 0xffff {
			t.Errorf("pointer pixels = %#x, %#x; want black tip and white fill", r1, r2)
		}
	})

	t.Run("pyautogui types real text", func(t *testing.T) {
		out := filepath.Join(g.Home, "typed.txt")
		// The terminal runs until a line is typed; its Execute returning is
		// the event that the text arrived.
		done := make(chan error, 1)
		go func() {
			_, err := c.Execute(ctx, guest.Argv("xterm", "-T", "typing-target", "-geometry", "80x10+0+0",
				"-e", "sh", "-c", "head -n 1 > "+out))
			done <- err
		}()
		id := g.WaitWindow(t, "typing-target")
		if err := c.ActivateWindow(ctx, guest.Window{Name: "typing-target"}); err != nil {
			t.Fatal(err)
		}
		exec(t, c, guest.Argv("xdotool", "windowfocus", "--sync", id))
		code := "pyautogui.typewrite('oops'); pyautogui.hotkey('ctrl', 'u'); " +
			"pyautogui.write('Hello, legato! <a_b> ~/x:y \"q\" 42', interval=0.01); pyautogui.press(['enter'])"
		res, err := c.RunPyautogui(ctx, code)
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("run: %v %+v", err, res)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got, err := c.File(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		// ctrl+u erased "oops": the hotkey reached the terminal as a chord.
		if diff := cmp.Diff("Hello, legato! <a_b> ~/x:y \"q\" 42\n", string(got)); diff != "" {
			t.Errorf("typed text (-want +got):\n%s", diff)
		}
	})

	t.Run("pyautogui click focuses a window", func(t *testing.T) {
		if err := c.Launch(ctx, guest.Argv("xterm", "-T", "left-one", "-geometry", "40x10+0+0")); err != nil {
			t.Fatal(err)
		}
		if err := c.Launch(ctx, guest.Argv("xterm", "-T", "right-one", "-geometry", "40x10+700+300")); err != nil {
			t.Fatal(err)
		}
		g.WaitWindow(t, "left-one")
		right := g.WaitWindow(t, "right-one")
		if err := c.ActivateWindow(ctx, guest.Window{Name: "left-one", Strict: true}); err != nil {
			t.Fatal(err)
		}
		g.WaitActive(t, "^left-one$")
		geo := exec(t, c, guest.Argv("xdotool", "getwindowgeometry", "--shell", right)).Output
		vals := map[string]int{}
		for _, line := range strings.Fields(geo) {
			k, v, _ := strings.Cut(line, "=")
			vals[k], _ = strconv.Atoi(v)
		}
		cx, cy := vals["X"]+vals["WIDTH"]/2, vals["Y"]+vals["HEIGHT"]/2
		res, err := c.RunPyautogui(ctx, fmt.Sprintf("pyautogui.click(%d, %d)", cx, cy))
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("click: %v %+v", err, res)
		}
		g.WaitActive(t, "^right-one$")
		for _, name := range []string{"left-one", "right-one"} {
			if err := c.CloseWindow(ctx, guest.Window{Name: name, Strict: true}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("pyautogui API", func(t *testing.T) {
		tests := []struct {
			code     string
			wantExit int
			wantOut  string
		}{
			{"print(pyautogui.size())", 0, fmt.Sprintf("Size(width=%d, height=%d)\n", g.Width, g.Height)},
			{"pyautogui.moveTo(10, 10, duration=0.2, tween=pyautogui.easeInQuad); print(pyautogui.position())", 0, "Point(x=10, y=10)\n"},
			{"pyautogui.moveTo(100, 100); pyautogui.moveRel(5, -5); print(tuple(pyautogui.position()))", 0, "(105, 95)\n"},
			{"pyautogui.dragTo(200, 150, duration=0.2, button='left'); print(tuple(pyautogui.position()))", 0, "(200, 150)\n"},
			{"pyautogui.click(button='right', x=50, y=60); pyautogui.press('esc'); print('ok')", 0, "ok\n"},
			{"pyautogui.doubleClick(30, 30); pyautogui.tripleClick(31, 31); pyautogui.middleClick(32, 32); print('ok')", 0, "ok\n"},
			{"pyautogui.scroll(-3); pyautogui.scroll(2, x=40, y=40); pyautogui.hscroll(4); print(tuple(pyautogui.position()))", 0, "(40, 40)\n"},
			{"pyautogui.keyDown('shift'); pyautogui.keyUp('shift'); pyautogui.hotkey(['ctrl', 'shift']); print('ok')", 0, "ok\n"},
			{"pyautogui.press('no-such-key')", 1, ""},
		}
		for _, tt := range tests {
			t.Run(tt.code, func(t *testing.T) {
				res, err := c.RunPyautogui(ctx, tt.code)
				if err != nil {
					t.Fatal(err)
				}
				if res.ReturnCode != tt.wantExit || (tt.wantExit == 0 && res.Output != tt.wantOut) {
					t.Errorf("exit %d, output %q, stderr %q; want exit %d, output %q",
						res.ReturnCode, res.Output, res.Error, tt.wantExit, tt.wantOut)
				}
			})
		}
		// FAILSAFE is off in OSWorld's prefix; on, a pointer in a corner stops the action.
		res, err := c.Execute(ctx, guest.Argv("python", "-c",
			"import pyautogui; pyautogui.FAILSAFE = False; pyautogui.moveTo(0, 0); pyautogui.FAILSAFE = True; pyautogui.click(5, 5)"))
		if err != nil || res.ReturnCode == 0 || !strings.Contains(res.Error, "FailSafeException") {
			t.Errorf("failsafe: %v %+v, want FailSafeException", err, res)
		}
	})

	t.Run("upload and file", func(t *testing.T) {
		data := make([]byte, 3<<20+17)
		rand.Read(data)
		guestPath := filepath.Join(g.Home, "deep", "dir", "blob.bin")
		if err := c.Upload(ctx, guestPath, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		got, err := c.File(ctx, guestPath)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("round trip changed the file: %d bytes back of %d", len(got), len(data))
		}
		// "~/" is the guest user's home, as in OSWorld.
		local := filepath.Join(t.TempDir(), "small.txt")
		os.WriteFile(local, []byte("small"), 0o644)
		if err := c.UploadFile(ctx, "~/small.txt", local); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(g.Home, "small.txt")); err != nil || string(b) != "small" {
			t.Errorf("~/small.txt = %q, %v", b, err)
		}
		var buf bytes.Buffer
		if n, err := c.CopyFile(ctx, "~/small.txt", &buf); err != nil || n != 5 || buf.String() != "small" {
			t.Errorf("CopyFile = %d, %q, %v", n, buf.String(), err)
		}
		if _, err := c.File(ctx, "~/no-such-file"); !errors.Is(err, guest.ErrNotFound) {
			t.Errorf("missing file: error = %v, want ErrNotFound", err)
		}
		if err := c.Upload(ctx, "~/short.bin", strings.NewReader("abc"), 10); err == nil {
			t.Errorf("upload of fewer bytes than announced succeeded")
		}
	})

	t.Run("open file", func(t *testing.T) {
		p := filepath.Join(g.Home, "notes.txt")
		os.WriteFile(p, []byte("some notes\n"), 0o644)
		if err := c.OpenFile(ctx, p); err != nil {
			t.Fatal(err)
		}
		g.WaitActive(t, "notes\\.txt")
		if err := c.OpenFile(ctx, "/no/such/file.txt"); !errors.Is(err, guest.ErrNotFound) {
			t.Errorf("missing file: error = %v, want ErrNotFound", err)
		}
		// A program that never shows a window: the guest gives up first, and says so.
		short, _ := guest.New(g.URL, guest.Options{Timeouts: guest.Timeouts{OpenFile: 2 * time.Second}})
		err := short.OpenFile(ctx, "true")
		var ge *guest.Error
		if !errors.As(err, &ge) || ge.Status != 500 || !strings.Contains(ge.Body, "within") {
			t.Errorf("no window: error = %v, want the guest's 500", err)
		}
		c.CloseWindow(ctx, guest.Window{Name: "notes.txt"})
	})

	t.Run("launch", func(t *testing.T) {
		if err := c.Launch(ctx, guest.ShellLine("exec xterm -T launched-by-shell")); err != nil {
			t.Fatal(err)
		}
		g.WaitWindow(t, "launched-by-shell")
		c.CloseWindow(ctx, guest.Window{Name: "launched-by-shell"})
		err := c.Launch(ctx, guest.Argv("no-such-program-here"))
		var ge *guest.Error
		if !errors.As(err, &ge) || ge.Status != 500 {
			t.Errorf("missing program: error = %v, want a 500", err)
		}
	})

	// A launched program that quits is gone when the next request asks,
	// not a zombie of the server's: a grader looking for it with pgrep
	// would take it for running (GIMP after Ctrl+Q did).
	t.Run("launched program that quits is reaped", func(t *testing.T) {
		dir := t.TempDir()
		name := fmt.Sprintf("lgreap%d", time.Now().UnixNano()%1e8)
		prog, stop := filepath.Join(dir, name), filepath.Join(dir, "stop")
		sh, err := os.ReadFile("/bin/sh")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(prog, sh, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := c.Launch(ctx, guest.Argv(prog, "-c", "while [ ! -e "+stop+" ]; do sleep 0.05; done")); err != nil {
			t.Fatal(err)
		}
		// Stop it, and wait in the guest until it is no longer running
		// (a zombie or gone).
		wait := fmt.Sprintf("pgrep -x %s >/dev/null || exit 3; touch %s; while pgrep -x %s -r R,S,D >/dev/null; do sleep 0.05; done", name, stop, name)
		if r, err := c.Execute(ctx, guest.ShellLine(wait)); err != nil || r.ReturnCode != 0 {
			t.Fatalf("stop the launched program: %v %+v", err, r)
		}
		r, err := c.Execute(ctx, guest.ShellLine("pgrep -a -x "+name+"; ps -o stat= -C "+name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(r.Output) != "" {
			t.Errorf("the launched program that quit is still in the process table: %q", r.Output)
		}
	})

	t.Run("close window", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := c.Execute(ctx, guest.Argv("xterm", "-T", "to-close"))
			done <- err
		}()
		g.WaitWindow(t, "to-close")
		if err := c.CloseWindow(ctx, guest.Window{Name: "to-close"}); err != nil {
			t.Fatal(err)
		}
		// The terminal exits when its window is closed.
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("accessibility", func(t *testing.T) {
		if err := c.Launch(ctx, guest.Argv("xterm", "-T", "a11y-window")); err != nil {
			t.Fatal(err)
		}
		g.WaitWindow(t, "a11y-window")
		defer c.CloseWindow(ctx, guest.Window{Name: "a11y-window"})
		tree, err := c.Accessibility(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var root struct {
			XMLName xml.Name
			Apps    []struct {
				Name   string `xml:"name,attr"`
				Frames []struct {
					Name string `xml:"name,attr"`
				} `xml:"frame"`
			} `xml:"application"`
		}
		if err := xml.Unmarshal([]byte(tree), &root); err != nil {
			t.Fatalf("tree is not XML: %v\n%s", err, tree)
		}
		found := false
		for _, app := range root.Apps {
			for _, f := range app.Frames {
				found = found || (app.Name == "xterm" && f.Name == "a11y-window")
			}
		}
		if root.XMLName.Local != "desktop-frame" || !found {
			t.Errorf("tree lacks desktop-frame/application[xterm]/frame[a11y-window]:\n%s", tree)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		out, ok, err := c.Terminal(ctx)
		if err != nil || ok || out != "" {
			t.Errorf("Terminal = %q, %v, %v; want no terminal text from the test guest", out, ok, err)
		}
	})

	t.Run("wallpaper", func(t *testing.T) {
		p := filepath.Join(g.Home, "wall.png")
		os.WriteFile(p, pngOf(t, 4, 4), 0o644)
		if err := c.ChangeWallpaper(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := c.ChangeWallpaper(ctx, "~/missing.png"); !errors.Is(err, guest.ErrNotFound) {
			t.Errorf("missing wallpaper: error = %v, want ErrNotFound", err)
		}
	})

	t.Run("execute with verification", func(t *testing.T) {
		flag := filepath.Join(g.Home, "verified")
		res, err := c.ExecuteWithVerification(ctx, guest.Argv("touch", flag),
			guest.Verification{CommandSuccess: "test -f " + flag, MaxWait: 5 * time.Second})
		if err != nil || res.Verification != "passed" {
			t.Errorf("= %+v, %v; want passed", res, err)
		}
		_, err = c.ExecuteWithVerification(ctx, guest.Argv("true"),
			guest.Verification{WindowExists: "no such window", MaxWait: 500 * time.Millisecond, CheckInterval: 100 * time.Millisecond})
		if !errors.Is(err, guest.ErrVerificationFailed) {
			t.Errorf("error = %v, want ErrVerificationFailed", err)
		}
	})

	t.Run("unknown endpoint", func(t *testing.T) {
		// The server answers 404 for paths it does not serve; OSWorld's
		// controller relies on that to fall back from /run_python.
		resp, err := httpPost(g.URL+"/run_python", `{"code":"print(1)"}`)
		if err != nil || resp != 404 {
			t.Errorf("POST /run_python = %d, %v; want 404", resp, err)
		}
	})
}

func httpPost(u, body string) (int, error) {
	// No keep-alive: an idle connection's goroutines would outlive the test.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
