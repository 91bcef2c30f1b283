package setup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/setup"
)

// callLog is the guest requests and window waits of a test, in order.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, s)
}

// fakeWindows is a setup.WindowWaiter that logs its calls and finds
// windows as told.
type fakeWindows struct {
	log *callLog
	// found says, per wait (in order), whether its window maps.
	found []bool
	waits int
}

func (f *fakeWindows) MarkWindows(ctx context.Context) (setup.WindowMark, error) {
	f.log.add("mark")
	return setup.WindowMark(fmt.Sprintf(`{"n":%d}`, f.waits)), nil
}

func (f *fakeWindows) WaitWindow(ctx context.Context, mark setup.WindowMark, want setup.WantedWindow, max time.Duration) (setup.WindowSeen, error) {
	f.log.add(fmt.Sprintf("wait %s %+v max=%v", mark, want, max))
	found := f.found[f.waits]
	f.waits++
	if !found {
		return setup.WindowSeen{Others: []setup.SeenWindow{{ID: "0x1", Title: "other"}}}, nil
	}
	return setup.WindowSeen{Window: &setup.SeenWindow{ID: "0x2", PID: 7, Title: "mine"}}, nil
}

// logRecords keeps the log records of a test.
type logRecords struct {
	mu  sync.Mutex
	got []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r)
	return nil
}
func (l *logRecords) WithAttrs(attrs []slog.Attr) slog.Handler { return &withAttrs{l, attrs} }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }

type withAttrs struct {
	*logRecords
	attrs []slog.Attr
}

func (w *withAttrs) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(w.attrs...)
	return w.logRecords.Handle(ctx, r)
}
func (w *withAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &withAttrs{w.logRecords, append(append([]slog.Attr{}, w.attrs...), attrs...)}
}

// warnings returns the warnings logged, each as its message and attributes.
func (l *logRecords) warnings() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.got {
		if r.Level != slog.LevelWarn {
			continue
		}
		m := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		out = append(out, m)
	}
	return out
}

// TestStepsWaitForTheirProgramsWindow: a step that starts a program is
// bracketed by a mark and a wait for its window; other steps are not; a
// window that never maps is a warning naming the step and the program,
// and the setup goes on.
func TestStepsWaitForTheirProgramsWindow(t *testing.T) {
	calls := &callLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var cmd struct {
			Command any `json:"command"`
		}
		json.Unmarshal(body, &cmd)
		calls.add(fmt.Sprintf("%s %v", r.URL.Path, cmd.Command))
		if strings.HasSuffix(r.URL.Path, "execute") {
			io.WriteString(w, `{"status":"success","output":"","error":"","returncode":0}`)
			return
		}
		io.WriteString(w, `"ok"`)
	}))
	defer srv.Close()
	c, err := guest.New(srv.URL, guest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	logs := &logRecords{}
	win := &fakeWindows{log: calls, found: []bool{true, false, true}}
	ctrl := &setup.Controller{Guest: c, Windows: win, WindowWait: 3 * time.Second, Logger: slog.New(logs)}
	task := desktop.Task{ID: "t-win"}
	err = ctrl.Run(t.Context(), task, steps(t, `[
		{"type":"launch","parameters":{"command":"VLC_VERBOSE=-1 vlc --no-audio","shell":true}},
		{"type":"launch","parameters":{"command":["socat","tcp-listen:9222,fork","tcp:localhost:1337"]}},
		{"type":"execute","parameters":{"command":["mkdir","-p","/tmp/a"]}},
		{"type":"execute","parameters":{"command":"sh -c 'sleep 1; exec slowapp -title x' >/dev/null 2>&1 &","shell":true}},
		{"type":"open","parameters":{"path":"/home/user/a b.xlsx"}}
	]`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mark",
		"/setup/launch VLC_VERBOSE=-1 vlc --no-audio",
		`wait {"n":0} {AnyProcess:false Title:} max=3s`,
		"/setup/launch [socat tcp-listen:9222,fork tcp:localhost:1337]",
		"/setup/execute [mkdir -p /tmp/a]",
		"mark",
		"/setup/execute sh -c 'sleep 1; exec slowapp -title x' >/dev/null 2>&1 &",
		`wait {"n":1} {AnyProcess:false Title:} max=3s`,
		"mark",
		"/setup/open_file <nil>",
		`wait {"n":2} {AnyProcess:true Title:a b.xlsx} max=3s`,
	}
	if diff := cmp.Diff(want, calls.calls); diff != "" {
		t.Errorf("guest requests and window waits (-want +got):\n%s", diff)
	}
	warns := logs.warnings()
	if len(warns) != 1 {
		t.Fatalf("warnings %v; want one, for step 4", warns)
	}
	w := warns[0]
	for k, v := range map[string]string{"task": "t-win", "step": "4", "type": "execute", "program": "slowapp", "waited": "3s", "other_new_windows": "[other (, 0x1)]"} {
		if w[k] != v {
			t.Errorf("warning %v: %s = %q, want %q", w, k, w[k], v)
		}
	}
	if !strings.Contains(w["msg"], "mapped no window") || !strings.Contains(w["command"], "slowapp") {
		t.Errorf("warning %v: want it to say the program mapped no window, with its command", w)
	}
}
