package setup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/cdp/cdptest"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/guest/guesttest"
	"legato/rl/desktop/osworld/setup"
)

// emptyHistory builds an empty Chrome-like history database (the urls and
// visits tables update_browse_history writes to) with the host's python3.
func emptyHistory(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "history.sqlite")
	const schema = `CREATE TABLE urls(id INTEGER PRIMARY KEY AUTOINCREMENT, url LONGVARCHAR, title LONGVARCHAR,
visit_count INTEGER DEFAULT 0 NOT NULL, typed_count INTEGER DEFAULT 0 NOT NULL, last_visit_time INTEGER NOT NULL,
hidden INTEGER DEFAULT 0 NOT NULL);
CREATE TABLE visits(id INTEGER PRIMARY KEY AUTOINCREMENT, url INTEGER NOT NULL, visit_time INTEGER NOT NULL,
from_visit INTEGER, transition INTEGER DEFAULT 0 NOT NULL, segment_id INTEGER, visit_duration INTEGER DEFAULT 0 NOT NULL);`
	out, err := exec.Command("python3", "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.close()", p, schema).CombinedOutput()
	if err != nil {
		t.Fatalf("python3 sqlite3: %v\n%s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRunOnGuest runs every setup type that works offline against the guest
// server on the host, and checks what each did in the guest.
func TestRunOnGuest(t *testing.T) {
	g := guesttest.Start(t, guesttest.Options{})
	history := emptyHistory(t)
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/history_empty.sqlite" {
			w.Write(history)
			return
		}
		io.WriteString(w, "content of "+r.URL.Path)
	}))
	defer files.Close()
	cache, err := setup.NewCache(t.TempDir(), setup.CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	browser := cdptest.New(t)
	bc, _ := cdp.New(browser.URL, nil)
	defer bc.CloseIdleConnections()
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "local.txt"), []byte("from the host"), 0o644)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	outDir := t.TempDir()
	ctrl := &setup.Controller{
		Guest: g.Client, Downloads: cache, OutputDir: outDir, LocalDir: local, Browser: bc,
		ScreenWidth: 1280, ScreenHeight: 720, ClientPassword: "s3cret-pw",
		UntilTimeout: 3 * time.Second, UntilInterval: 20 * time.Millisecond,
		HistoryTemplateURL: files.URL + "/history_empty.sqlite", HistoryPath: "~/.config/google-chrome/Default/History",
		Now: func() time.Time { return now },
	}
	home := g.Home
	ctx := context.Background()
	run := func(t *testing.T, js string) error {
		t.Helper()
		js = strings.ReplaceAll(js, "$HOME", home)
		js = strings.ReplaceAll(js, "$FILES", files.URL)
		return ctrl.Run(ctx, desktop.Task{ID: "task-7"}, steps(t, js))
	}
	mustRun := func(t *testing.T, js string) {
		t.Helper()
		if err := run(t, js); err != nil {
			t.Fatal(err)
		}
	}
	read := func(t *testing.T, p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	sh := func(t *testing.T, line string) string {
		t.Helper()
		res, err := g.Client.Execute(ctx, guest.ShellLine(line))
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("%s: %v %+v", line, err, res)
		}
		return strings.TrimSpace(res.Output)
	}

	t.Run("download", func(t *testing.T) {
		mustRun(t, `[{"type":"download","parameters":{"files":[
			{"url":"$FILES/a/report.xlsx","path":"$HOME/Desktop/report.xlsx"},
			{"url":"$FILES/b.txt","path":"~/b.txt"}]}}]`)
		got := []string{read(t, home+"/Desktop/report.xlsx"), read(t, home+"/b.txt")}
		if diff := cmp.Diff([]string{"content of /a/report.xlsx", "content of /b.txt"}, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})

	t.Run("upload_file", func(t *testing.T) {
		mustRun(t, `[{"type":"upload_file","parameters":{"files":[{"local_path":"local.txt","path":"$HOME/up/local.txt"}]}}]`)
		if got := read(t, home+"/up/local.txt"); got != "from the host" {
			t.Errorf("uploaded %q", got)
		}
	})

	t.Run("command placeholders", func(t *testing.T) {
		mustRun(t, `[{"type":"command","parameters":{"command":"echo {SCREEN_WIDTH}x{SCREEN_HEIGHT} {SCREEN_WIDTH_HALF},{SCREEN_HEIGHT_HALF} {CLIENT_PASSWORD} > ~/ph.txt","shell":"true"}},
			{"type":"execute","parameters":{"command":["sh","-c","echo {SCREEN_WIDTH_HALF} >> ~/ph.txt"]}}]`)
		if got := read(t, home+"/ph.txt"); got != "1280x720 640,360 s3cret-pw\n640\n" {
			t.Errorf("ph.txt = %q", got)
		}
	})

	t.Run("execute saves output", func(t *testing.T) {
		mustRun(t, `[{"type":"execute","parameters":{"command":["sh","-c","echo to-out; echo to-err >&2"],"stdout":"accounts.csv","stderr":"sub/err.txt"}}]`)
		got := []string{read(t, filepath.Join(outDir, "accounts.csv")), read(t, filepath.Join(outDir, "sub", "err.txt"))}
		if diff := cmp.Diff([]string{"to-out\n", "to-err\n"}, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})

	t.Run("execute until", func(t *testing.T) {
		// Each poll counts; the step ends when the count reaches 3.
		mustRun(t, `[{"type":"execute","parameters":{"command":"n=$(cat ~/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > ~/count; echo polled $n","shell":true,"until":{"stdout":"polled 3"}}}]`)
		if got := read(t, home+"/count"); got != "3\n" {
			t.Errorf("polled %q times, want 3", got)
		}
		err := run(t, `[{"type":"sleep","parameters":{"seconds":0}},{"type":"execute","parameters":{"command":"echo {CLIENT_PASSWORD}; exit 1","shell":true,"until":{"returncode":0}}}]`)
		if err == nil || !strings.Contains(err.Error(), "step 2 of task task-7 (execute): command") || !strings.Contains(err.Error(), "did not reach its until condition") {
			t.Errorf("error = %v, want the until timeout of step 2", err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("error shows the client password: %v", err)
		}
	})

	t.Run("launch activate close", func(t *testing.T) {
		mustRun(t, `[{"type":"launch","parameters":{"command":"xterm -T setup-left -geometry 40x10+0+0"}},
			{"type":"launch","parameters":{"command":["xterm","-T","setup-right","-geometry","40x10+600+300"]}},
			{"type":"execute","parameters":{"command":["timeout","20","xdotool","search","--sync","--onlyvisible","--name","setup-left"]}},
			{"type":"execute","parameters":{"command":["timeout","20","xdotool","search","--sync","--onlyvisible","--name","setup-right"]}},
			{"type":"activate_window","parameters":{"window_name":"setup-left","strict":true}}]`)
		g.WaitActive(t, "^setup-left$")
		mustRun(t, `[{"type":"activate_window","parameters":{"window_name":"setup-right"}}]`)
		g.WaitActive(t, "^setup-right$")
		mustRun(t, `[
			{"type":"close_window","parameters":{"window_name":"setup-left"}},
			{"type":"close_window","parameters":{"window_name":"setup-right"}}]`)
	})

	t.Run("open", func(t *testing.T) {
		os.WriteFile(home+"/opened.txt", []byte("x"), 0o644)
		mustRun(t, `[{"type":"open","parameters":{"path":"$HOME/opened.txt"}}]`)
		g.WaitActive(t, "opened\\.txt")
		mustRun(t, `[{"type":"close_window","parameters":{"window_name":"opened.txt"}}]`)
		err := run(t, `[{"type":"open","parameters":{"path":"$HOME/missing.xlsx"}}]`)
		if !errors.Is(err, guest.ErrNotFound) || !strings.HasPrefix(err.Error(), "step 1 of task task-7 (open): guest setup/open_file") {
			t.Errorf("error = %v, want a not-found step 1 error", err)
		}
	})

	t.Run("execute_with_verification", func(t *testing.T) {
		mustRun(t, `[{"type":"execute_with_verification","parameters":{"command":["touch","$HOME/v"],"verification":{"command_success":"test -f $HOME/v"},"max_wait_time":5}}]`)
		err := run(t, `[{"type":"execute_with_verification","parameters":{"command":["true"],"verification":{"command_success":"false"},"max_wait_time":0.3,"check_interval":0.1}}]`)
		if !errors.Is(err, guest.ErrVerificationFailed) {
			t.Errorf("error = %v, want ErrVerificationFailed", err)
		}
	})

	t.Run("change_wallpaper", func(t *testing.T) {
		os.WriteFile(home+"/wall.png", []byte("png"), 0o644)
		mustRun(t, `[{"type":"change_wallpaper","parameters":{"path":"~/wall.png"}}]`)
		if err := run(t, `[{"type":"change_wallpaper","parameters":{"path":"~/none.png"}}]`); !errors.Is(err, guest.ErrNotFound) {
			t.Errorf("error = %v, want ErrNotFound", err)
		}
	})

	t.Run("chrome tabs", func(t *testing.T) {
		browser.NotReadyFor(2) // just launched: the first tries fail
		mustRun(t, `[{"type":"chrome_open_tabs","parameters":{"urls_to_open":["https://www.lonelyplanet.com","https://www.airbnb.com","https://www.tripadvisor.com"]}},
			{"type":"chrome_close_tabs","parameters":{"urls_to_close":["https://tripadvisor.com/","https://not-open.example"]}}]`)
		want := []string{"https://www.lonelyplanet.com", "https://www.airbnb.com"}
		if diff := cmp.Diff(want, browser.TabURLs()); diff != "" {
			t.Errorf("tabs (-want +got):\n%s", diff)
		}
		if n := browser.VersionRequests(); n < 4 {
			t.Errorf("%d /json/version requests, want the 2 failures retried", n)
		}
	})

	t.Run("update_browse_history", func(t *testing.T) {
		mustRun(t, `[{"type":"update_browse_history","parameters":{"history":[
			{"url":"https://a.example/","title":"A","visit_time_from_now_in_seconds":3600},
			{"url":"https://b.example/x","title":"B","visit_time_from_now_in_seconds":0}]}}]`)
		out := sh(t, `python3 -c "import json, os, sqlite3; c = sqlite3.connect(os.path.expanduser('~/.config/google-chrome/Default/History')); print(json.dumps(c.execute('SELECT u.url, u.title, u.visit_count, u.last_visit_time, v.visit_time, v.transition FROM urls u JOIN visits v ON v.url = u.id ORDER BY u.id').fetchall()))"`)
		var rows [][]any
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		// Chrome time: microseconds since 1601-01-01 UTC, 11644473600 s
		// before Unix time.
		ta := float64(now.Add(-time.Hour).UnixMicro() + 11644473600e6)
		tb := float64(now.UnixMicro() + 11644473600e6)
		want := [][]any{
			{"https://a.example/", "A", 1.0, ta, ta, 805306368.0},
			{"https://b.example/x", "B", 1.0, tb, tb, 805306368.0},
		}
		if diff := cmp.Diff(want, rows); diff != "" {
			t.Errorf("history rows (-want +got):\n%s", diff)
		}
	})

	t.Run("refused step runs nothing", func(t *testing.T) {
		err := run(t, `[{"type":"command","parameters":{"command":["touch","$HOME/should-not-exist"]}},{"type":"googledrive","parameters":{}}]`)
		if !errors.Is(err, desktop.ErrUnsupported) || desktop.IsFailure(ctx, err) {
			t.Errorf("error = %v, want ErrUnsupported (not a desktop failure)", err)
		}
		if _, err := os.Stat(home + "/should-not-exist"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("step 1 ran although step 2 is refused")
		}
	})

	t.Run("guest failure is a desktop failure", func(t *testing.T) {
		err := run(t, `[{"type":"launch","parameters":{"command":["no-such-program"]}}]`)
		if !desktop.IsFailure(ctx, err) || !strings.Contains(err.Error(), fmt.Sprintf("step 1 of task task-7 (launch): guest setup/launch %s/setup/launch: status 500", g.URL)) {
			t.Errorf("error = %v", err)
		}
	})
}
