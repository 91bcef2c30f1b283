package osworld

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
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

// TestFastResetRestoresHomeAndKillsApps dirties a guest the way a task
// does (files changed, added, removed; a program left running) and checks
// that the next Reset undoes all of it.
func TestFastResetRestoresHomeAndKillsApps(t *testing.T) {
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
	clean := homeState(t, g.Home)
	d := g.desktop(t, g.config(t, g.URL)) // attaching makes the baseline

	launch := task(t, "launch-app", "legato_test", fmt.Sprintf(`{
	  "instruction": "Type in the window.",
	  "config": [{"type": "launch", "parameters": {"command": [%q, "-T", "legato-app"]}}],
	  "evaluator": {"func": "infeasible"}}`, g.AppPath))
	if err := d.Reset(t.Context(), launch); err != nil {
		t.Fatal(err)
	}
	g.WaitWindow(t, "legato-app")
	g.sh(t, `echo dirty > ~/keep.txt; echo new > ~/new.txt; rm ~/gone.txt; mkdir -p ~/docs/deep && echo b > ~/docs/deep/b.txt`)
	if diff := cmp.Diff(clean, homeState(t, g.Home)); diff == "" {
		t.Fatal("the home did not change; the test cannot tell a restore")
	}

	plain := task(t, "plain", "legato_test", `{"instruction": "Nothing.", "evaluator": {"func": "infeasible"}}`)
	if err := d.Reset(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
	if got := d.LastReset().Kind; got != ResetFast {
		t.Errorf("reset kind %q, want %q", got, ResetFast)
	}
	if diff := cmp.Diff(clean, homeState(t, g.Home)); diff != "" {
		t.Errorf("home after the fast reset (-want +got):\n%s", diff)
	}
	if out := g.sh(t, fmt.Sprintf(`ps -eo stat=,comm= | awk '$1 !~ /^Z/ && $2 == %q' | wc -l`, g.App)); out != "0" {
		t.Errorf("%s processes of %s still running after the fast reset", out, g.App)
	}
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

func TestResetKind(t *testing.T) {
	tests := []struct {
		name        string
		vm, fresh   bool
		noFastReset bool
		domain      string
		want        string
		wantWarn    bool
	}{
		{name: "vm chrome", vm: true, domain: "chrome", want: ResetFast},
		{name: "vm os", vm: true, domain: "os", want: ResetRevert},
		{name: "vm multi_apps", vm: true, domain: "multi_apps", want: ResetRevert},
		{name: "vm no fast reset", vm: true, noFastReset: true, domain: "chrome", want: ResetRevert},
		{name: "vm fresh os", vm: true, fresh: true, domain: "os", want: ResetNone},
		{name: "vm fresh chrome", vm: true, fresh: true, domain: "chrome", want: ResetNone},
		{name: "guest chrome", domain: "chrome", want: ResetFast},
		{name: "guest os warns", domain: "os", want: ResetFast, wantWarn: true},
		{name: "guest no fast reset warns", noFastReset: true, domain: "gimp", want: ResetFast, wantWarn: true},
		{name: "guest fresh is not trusted", fresh: true, domain: "gimp", want: ResetFast},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logged strings.Builder
			cfg := Config{NoFastReset: tt.noFastReset}.withDefaults()
			d := &Desktop{cfg: cfg, fresh: tt.fresh, warned: map[string]bool{}, log: testLoggerTo(&logged)}
			if tt.vm {
				d.vm = &vm.VM{} // only compared with nil
			}
			got := d.resetKind(desktop.Task{ID: "t", Domain: tt.domain})
			if got != tt.want {
				t.Errorf("resetKind = %q, want %q", got, tt.want)
			}
			if warned := strings.Contains(logged.String(), "level=WARN"); warned != tt.wantWarn {
				t.Errorf("warned = %v, want %v; log:\n%s", warned, tt.wantWarn, logged.String())
			}
			// A second task of the domain is not warned about again.
			logged.Reset()
			d.resetKind(desktop.Task{ID: "t2", Domain: tt.domain})
			if strings.Contains(logged.String(), "level=WARN") {
				t.Errorf("warned twice about domain %s", tt.domain)
			}
		})
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
	if got := d.LastReset(); got != (ResetReport{}) {
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
