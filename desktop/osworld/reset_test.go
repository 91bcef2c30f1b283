package osworld

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
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

// homeState lists a home directory: each entry's path and, for files,
// content.
func homeState(t *testing.T, home string) map[string]string {
	t.Helper()
	st := map[string]string{}
	err := filepath.WalkDir(home, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(home, p)
		if e.IsDir() {
			st[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		st[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestFastResetUndoesTheAttempt dirties a guest the way an attempt does
// (files changed, added, removed in the home and in /tmp; a task program,
// a program started from a terminal with setsid, an unrelated window, a
// terminal frozen with ctrl+s, all left running) and checks that the next
// Reset undoes all of it, and nothing else.
func TestFastResetUndoesTheAttempt(t *testing.T) {
	g := startHostGuest(t)
	for p, content := range map[string]string{"keep.txt": "clean\n", "docs/a.txt": "a\n", "gone.txt": "x\n"} {
		full := filepath.Join(g.Home, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := g.config(t, g.URL)
	// The reset starts the next attempt's action executor, which writes
	// its directory in tmp while the test reads tmp; this test is about
	// what the reset undoes, so it runs without one.
	cfg.NoExecutor = true
	if err := os.WriteFile(filepath.Join(g.Tmp(), "clean.txt"), []byte("clean\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clean := homeState(t, g.Home)
	cleanTmp := homeState(t, g.Tmp())
	// A program of the clean state, started the way an image's own
	// programs are: it must survive every reset.
	g.sh(t, `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > `+filepath.Join(filepath.Dir(g.Home), "keeper.pid"))
	keeper := strings.TrimSpace(readFile(t, filepath.Join(filepath.Dir(g.Home), "keeper.pid")))
	d := g.desktop(t, cfg) // attaching records the clean state
	cleanWindows := g.sh(t, `wmctrl -l | wc -l`)

	launch := task(t, "launch-app", "legato_test", fmt.Sprintf(`{
	  "instruction": "Type in the window.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-app"]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath))
	if err := d.Reset(t.Context(), launch); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-app")
	g.sh(t, `echo dirty > ~/keep.txt; echo new > ~/new.txt; rm ~/gone.txt; mkdir -p ~/docs/deep && echo b > ~/docs/deep/b.txt`)
	g.sh(t, fmt.Sprintf(`echo dirty > %[1]s/clean.txt; echo new > %[1]s/new.txt; mkdir -p %[1]s/d && echo x > %[1]s/d/x`, g.Tmp()))
	// Programs no list names: a sleep detached from everything, another
	// X program's window, and a terminal frozen by ctrl+s.
	g.sh(t, `setsid sleep 999 </dev/null >/dev/null 2>&1 &`)
	g.sh(t, `setsid xterm -T legato-other </dev/null >/dev/null 2>&1 &`)
	g.WaitWindow(t, "legato-other")
	g.sh(t, `setsid xterm -T legato-frozen </dev/null >/dev/null 2>&1 &`)
	g.WaitWindow(t, "legato-frozen")
	g.sh(t, `xdotool search --name legato-frozen windowactivate --sync key ctrl+s`)
	if diff := cmp.Diff(clean, homeState(t, g.Home)); diff == "" {
		t.Fatal("the home did not change; the test cannot tell a restore")
	}

	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	if err := d.Reset(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
	rep := d.LastReset()
	if rep.Kind != ResetFast || len(rep.Left) > 0 {
		t.Errorf("reset %q (%s), left %q; want %q with nothing left", rep.Kind, rep.Why, rep.Left, ResetFast)
	}
	if diff := cmp.Diff(clean, homeState(t, g.Home)); diff != "" {
		t.Errorf("home after the fast reset (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(cleanTmp, homeState(t, g.Tmp())); diff != "" {
		t.Errorf("tmp after the fast reset (-want +got):\n%s", diff)
	}
	if out := g.sh(t, fmt.Sprintf(`ps -eo stat=,comm=,args= | awk '$1 !~ /^Z/ && ($2 == %q || $0 ~ /sleep 999$/ || $0 ~ /legato-(other|frozen)/)' | wc -l`, g.App)); out != "0" {
		t.Errorf("%s processes of the attempt still running after the fast reset", out)
	}
	if got := g.sh(t, `wmctrl -l | wc -l`); got != cleanWindows {
		t.Errorf("%s windows after the fast reset, %s at the clean state:\n%s", got, cleanWindows, g.sh(t, "wmctrl -l"))
	}
	if err := syscall.Kill(atoi(t, keeper), 0); err != nil {
		t.Errorf("the clean state's own program (pid %s) did not survive the reset: %v", keeper, err)
	}
	for _, want := range []string{"sleep", "xterm", g.App} {
		if !slices.ContainsFunc(rep.Ended, func(p desktop.Process) bool { return p.Name == want }) {
			t.Errorf("ended %+v; want %s among them", rep.Ended, want)
		}
	}
}

// TestFastResetFindsWhatItCannotUndo: a process of the clean state that
// the attempt ended is reported as left, on a guest given by URL as an
// incomplete fast reset (no snapshot to fall back to), not as an error.
func TestFastResetFindsWhatItCannotUndo(t *testing.T) {
	g := startHostGuest(t)
	g.sh(t, `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > `+filepath.Join(filepath.Dir(g.Home), "keeper.pid"))
	keeper := strings.TrimSpace(readFile(t, filepath.Join(filepath.Dir(g.Home), "keeper.pid")))
	d := g.desktop(t, g.config(t, g.URL))
	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	if err := d.Reset(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
	if rep := d.LastReset(); rep.Kind != ResetFast {
		t.Fatalf("first reset %q (%s, left %q); want %q", rep.Kind, rep.Why, rep.Left, ResetFast)
	}
	if err := syscall.Kill(atoi(t, keeper), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// SIGKILL is delivered when the process next runs: on a loaded machine
	// the reset could still see it sleeping. Wait until it has died.
	waitDead(t, atoi(t, keeper))
	if err := d.Reset(t.Context(), plain); err != nil {
		t.Fatalf("Reset: %v; want an incomplete fast reset, not an error", err)
	}
	rep := d.LastReset()
	if rep.Kind != ResetFastIncomplete || !strings.Contains(strings.Join(rep.Left, " "), "sleep (pid "+keeper+")") ||
		!strings.Contains(rep.Why, "processes of the clean state are gone") {
		t.Errorf("reset %+v; want %q naming the sleep that is gone", rep, ResetFastIncomplete)
	}
}

// waitDead waits until pid has ended: gone from /proc, or a zombie. It
// polls /proc (a process that is not our child has no other event to
// wait on); the test's deadline bounds it.
func waitDead(t *testing.T, pid int) {
	t.Helper()
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the command's closing parenthesis.
		if s := string(b); strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("process %d still runs after SIGKILL", pid)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFastResetWithoutBaselineFails: a guest whose baseline vanished is a
// failure of the desktop (retried elsewhere), named as a fast reset.
func TestFastResetWithoutBaselineFails(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	d := g.desktop(t, cfg)
	if err := os.RemoveAll(cfg.BaselineDir); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	err := d.Reset(ctx, task(t, "plain", "legato_test", `{"instruction": "x", "evaluator": {"func": "infeasible"}}`))
	if !errors.Is(err, ErrFastReset) || !desktop.IsFailure(ctx, err) {
		t.Fatalf("Reset without a baseline: %v; want a desktop failure wrapping ErrFastReset", err)
	}
	var de *desktop.Error
	if !errors.As(err, &de) || de.Desktop != g.URL || !strings.HasPrefix(de.Op, "reset") {
		t.Errorf("error %#v: want a *desktop.Error naming the guest and the reset", err)
	}
}

// TestChromeStepWithoutDevTools: a guest given without a DevTools port
// refuses chrome steps as unsupported, before touching the guest, and the
// pool's check says so before the batch.
func TestChromeStepWithoutDevTools(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	d := g.desktop(t, cfg)
	tk := task(t, "tabs", "chrome", `{
	  "instruction": "Open the tabs.",
	  "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}],
	  "evaluator": {"func": "infeasible"}}`)
	ctx := t.Context()
	err := d.Reset(ctx, tk)
	if !errors.Is(err, desktop.ErrUnsupported) || desktop.IsFailure(ctx, err) {
		t.Errorf("Reset: %v; want ErrUnsupported, not a desktop failure", err)
	}
	if got := d.LastReset(); got.Kind != "" {
		t.Errorf("the refused task reset the desktop: %+v", got)
	}
	p, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.CheckTasks([]desktop.Task{tk}); !errors.Is(err, desktop.ErrUnsupported) || !strings.Contains(err.Error(), "devtools=PORT") {
		t.Errorf("CheckTasks: %v; want ErrUnsupported naming devtools=PORT", err)
	}
}

// TestErrorClassification: a guest that stops answering is a desktop
// failure; an action that fails inside the guest is not an error at all;
// after Close every method fails with ErrClosed.
func TestErrorClassification(t *testing.T) {
	g := startHostGuest(t)
	proxy := newHangProxy(t, g.URL, nil)
	d := g.desktop(t, g.config(t, proxy.srv.URL))
	ctx := t.Context()

	res, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: "raise ValueError('legato-bad-action')"})
	if err != nil {
		t.Fatalf("Act of a failing program: %v; want an ActResult", err)
	}
	if res.ExitCode == 0 || !strings.Contains(res.Error, "legato-bad-action") {
		t.Errorf("Act of a failing program: %+v; want a non-zero exit and the traceback", res)
	}

	proxy.srv.Close() // the guest is gone
	_, err = d.Observe(ctx)
	var de *desktop.Error
	if !desktop.IsFailure(ctx, err) || !errors.As(err, &de) || de.Op != "observe" {
		t.Errorf("Observe of a guest gone: %v; want a desktop failure in op observe", err)
	}
	if _, err := d.Act(ctx, desktop.Action{Kind: desktop.Code, Code: "pass"}); !desktop.IsFailure(ctx, err) {
		t.Errorf("Act on a guest gone: %v; want a desktop failure", err)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Reset(ctx, desktop.Task{ID: "x"}); !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Reset after Close: %v; want ErrClosed", err)
	}
}

// TestRootThroughSudo runs a script as root the way a guest server that
// runs as a user does (OSWorld's images): through sudo, with the password
// on stdin. The host guest runs as root, so a stand-in sudo on its PATH
// checks the password and runs the command.
func TestRootThroughSudo(t *testing.T) {
	g := startHostGuest(t)
	const pw = "s3cret pass'word"
	fake := "#!/bin/sh\n" +
		"[ \"$1\" = -S ] || { echo 'want -S' >&2; exit 1; }\n" +
		"shift; [ \"$1\" = -p ] && shift 2; [ \"$1\" = -- ] && shift\n" +
		"IFS= read -r got\n" +
		"[ \"$got\" = '" + strings.ReplaceAll(pw, "'", `'\''`) + "' ] || { echo \"wrong password\" >&2; exit 1; }\n" +
		"echo sudo-ok\n" +
		"exec \"$@\"\n"
	if err := os.WriteFile(filepath.Join(g.Bin, "sudo"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	sh := &guestShell{client: g.Client, password: pw}
	res, err := sh.runRoot(t.Context(), `printf '%s|' "$@"`, "a b", "$HOME", "c")
	if err != nil {
		t.Fatal(err)
	}
	if want := "sudo-ok\na b|$HOME|c|"; res.ReturnCode != 0 || res.Output != want {
		t.Errorf("through sudo: exit %d, output %q (stderr %q); want %q", res.ReturnCode, res.Output, res.Error, want)
	}
	sh.password = "wrong"
	if res, err := sh.runRoot(t.Context(), `echo ran`); err != nil || res.ReturnCode == 0 || strings.Contains(res.Output, "ran") {
		t.Errorf("with a wrong password: %+v, %v; want the script not to run", res, err)
	}
}

func testLoggerTo(b *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, nil))
}

// TestCheckTasksGoldenRefuse: a task id Golden.Refuse names must be one of
// the batch's tasks (a typo would silently refuse nothing).
func TestCheckTasksGoldenRefuse(t *testing.T) {
	g := startHostGuest(t)
	cfg := g.config(t, g.URL)
	cfg.Golden.Refuse = []string{"plain", "plian"}
	p, err := NewPool(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tk := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	err = p.CheckTasks([]desktop.Task{tk})
	if err == nil || !strings.Contains(err.Error(), `"plian"`) || strings.Contains(err.Error(), `"plain"`) {
		t.Errorf("CheckTasks: %v; want an error naming the unknown id plian only", err)
	}
}
