package grade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"legato/rl/desktop"
)

// execGuest is a guest server that runs the commands it is sent, as
// OSWorld's /execute does: argv lists, output and error decoded as UTF-8
// text (an error status when they are not, as Python's decoding raises),
// 500 for a program it cannot start. Its commands find a fake xdg-mime
// (fakeXDGMime) and python3 first on their PATH. It counts requests.
type execGuest struct {
	srv      *httptest.Server
	bin      string
	requests atomic.Int64
	// noPython refuses python3 as a guest without it would; delay is
	// added to every request: the round trip to a VM.
	noPython bool
	delay    time.Duration
}

// mimeAnswer is how the fake xdg-mime answers a query: its output, error
// and exit code.
type mimeAnswer struct {
	out, err string
	code     int
}

// fakeXDGMime is an xdg-mime that answers `xdg-mime query default TYPE`
// as answers say, with the shell's builtins alone (no process but its
// own), and prints nothing for other types.
func fakeXDGMime(answers map[string]mimeAnswer) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\ncase \"$3\" in\n")
	for _, typ := range slices.Sorted(maps.Keys(answers)) {
		a := answers[typ]
		fmt.Fprintf(&b, "%s) printf '%s'; printf '%s' >&2; exit %d;;\n", typ, shellPrintf(a.out), shellPrintf(a.err), a.code)
	}
	b.WriteString("esac\n")
	return b.String()
}

// shellPrintf is s as a printf format in single quotes: every byte but
// letters, digits and a few marks as an octal escape.
func shellPrintf(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(" .-_:+", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "\\%03o", c)
		}
	}
	return b.String()
}

func newExecGuest(t testing.TB, python string, answers map[string]mimeAnswer) *execGuest {
	t.Helper()
	g := &execGuest{bin: t.TempDir()}
	if err := os.WriteFile(filepath.Join(g.bin, "xdg-mime"), []byte(fakeXDGMime(answers)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(python, filepath.Join(g.bin, "python3")); err != nil {
		t.Fatal(err)
	}
	g.srv = httptest.NewServer(http.HandlerFunc(g.execute)) // 127.0.0.1
	t.Cleanup(g.srv.Close)
	return g
}

func (g *execGuest) port() int { return serverPort(g.srv) }

func (g *execGuest) execute(w http.ResponseWriter, r *http.Request) {
	g.requests.Add(1)
	select {
	case <-time.After(g.delay):
	case <-r.Context().Done():
		return
	}
	var req struct {
		Command []string `json:"command"`
		Shell   bool     `json:"shell"`
	}
	if r.URL.Path != "/execute" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Shell || len(req.Command) == 0 {
		writeJSON(w, 400, map[string]any{"status": "error", "message": "want an argv list without a shell"})
		return
	}
	prog := req.Command[0]
	if g.noPython && prog == "python3" {
		writeJSON(w, 500, map[string]any{"status": "error", "message": "[Errno 2] No such file or directory: 'python3'"})
		return
	}
	for _, dir := range []string{g.bin, "/usr/bin", "/bin"} {
		if p := filepath.Join(dir, prog); fileExists(p) {
			prog = p
			break
		}
	}
	cmd := exec.CommandContext(r.Context(), prog, req.Command[1:]...)
	cmd.Env = []string{"PATH=" + g.bin + ":/usr/bin:/bin", "LC_ALL=C.UTF-8", "HOME=" + g.bin}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		writeJSON(w, 500, map[string]any{"status": "error", "message": err.Error()})
		return
	}
	if !utf8.Valid(stdout.Bytes()) || !utf8.Valid(stderr.Bytes()) {
		writeJSON(w, 500, map[string]any{"status": "error", "message": "'utf-8' codec can't decode"})
		return
	}
	writeJSON(w, 200, map[string]any{"status": "success", "output": stdout.String(), "error": stderr.String(),
		"returncode": cmd.ProcessState.ExitCode()})
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// distinctVideoTypes are videoTypes without their repeats, in order.
func distinctVideoTypes() []string {
	var out []string
	for _, t := range videoTypes {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// videoPlayerTask scores 1 when the default video player is want.
func videoPlayerTask(t testing.TB, want string) desktop.Task {
	return desktop.Task{ID: "video", Evaluator: evaluator(t, map[string]any{
		"func": "exact_match", "result": map[string]any{"type": "default_video_player"},
		"expected": rule(map[string]any{"expected": want})})}
}

// TestDefaultVideoPlayerBatched: the native default_video_player getter
// asks the guest about every video type in one request, and finds the
// value OSWorld's getter finds asking once per type listed (the fixture
// checkout's version, through the bridge: 85 requests), and its own one
// request per type where the guest cannot run a batch: the most common
// answer, the first seen of two as common, "unknown" when none answers,
// and queries that fail (an exit code, an output that is not text) as
// the looped getter takes them.
func TestDefaultVideoPlayerBatched(t *testing.T) {
	python := needPython(t)
	types := distinctVideoTypes()
	const vlc, totem = "vlc.desktop\n", "org.gnome.Totem.desktop\n"
	answers := func(f func(i int, typ string) mimeAnswer) map[string]mimeAnswer {
		m := map[string]mimeAnswer{}
		for i, typ := range types {
			m["video/"+typ] = f(i, typ)
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		answers map[string]mimeAnswer
		want    string
	}{
		{"most common", answers(func(i int, _ string) mimeAnswer {
			if i%3 == 0 {
				return mimeAnswer{out: totem}
			}
			return mimeAnswer{out: vlc}
		}), vlc},
		// 21 types listed twice each for either; x-ogm+ogg, listed once,
		// answers nothing.
		{"a tie goes to the first seen", answers(func(i int, typ string) mimeAnswer {
			switch {
			case typ == "x-ogm+ogg":
				return mimeAnswer{}
			case i < 21:
				return mimeAnswer{out: totem}
			}
			return mimeAnswer{out: vlc}
		}), totem},
		{"none answers", answers(func(int, string) mimeAnswer { return mimeAnswer{code: 4, err: "no default"} }), "unknown"},
		// Failures: totem answers on 9 types (18 queries), vlc on 10
		// (19: x-ogm+ogg is listed once), one of which exits 1 after its
		// answer: it counts, as OSWorld takes the output whatever the
		// exit code, so vlc wins. 21 types print no text (the server
		// refuses them: they do not count, or they would win), 3 print
		// only an error.
		{"failing queries", answers(func(i int, typ string) mimeAnswer {
			switch {
			case i < 9:
				return mimeAnswer{out: totem}
			case i < 30:
				return mimeAnswer{out: "mpv\xff.desktop\n"}
			case i < 33:
				return mimeAnswer{err: "xdg-mime: no method available for querying", code: 3}
			case i == 33:
				return mimeAnswer{out: vlc, err: "warning", code: 1}
			}
			return mimeAnswer{out: vlc}
		}), vlc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := videoPlayerTask(t, tc.want)
			grade := func(g *execGuest, mode Mode) desktop.MetricRun {
				t.Helper()
				gr := newNativeGrader(t, GraderConfig{OSWorldDir: fixtureDir(t), Python: python, Mode: mode,
					Env: Env{ServerPort: g.port(), Platform: "Linux"}, Guest: clientFor(t, g.srv.URL)})
				r, err := gr.Evaluate(t.Context(), task, desktop.DoneAction)
				if err != nil || len(r.Metrics) != 1 {
					t.Fatalf("%v: %+v, %v", mode, r, err)
				}
				if r.Score != 1 {
					t.Errorf("%v: score %v, the getter returned %s; want %q", mode, r.Score, r.Metrics[0].ResultValue, tc.want)
				}
				return r.Metrics[0]
			}
			batched := newExecGuest(t, python, tc.answers)
			native := grade(batched, NativeOnly)
			if n := batched.requests.Load(); n != 1 {
				t.Errorf("the native getter took %d requests, want 1", n)
			}
			looped := newExecGuest(t, python, tc.answers)
			looped.noPython = true
			if m := grade(looped, NativeOnly); m != native {
				t.Errorf("one request per type (no python3 in the guest): %+v, batched %+v", m, native)
			}
			if n, want := looped.requests.Load(), int64(1+len(types)); n != want {
				t.Errorf("without python3 in the guest the native getter took %d requests, want %d (the batch, then one per type)", n, want)
			}
			osworld := newExecGuest(t, python, tc.answers)
			python := grade(osworld, PreferBridge)
			if python.Via != ViaPython || python.Result != native.Result || python.ResultValue != native.ResultValue {
				t.Errorf("OSWorld's way (through the bridge): %+v, native %+v", python, native)
			}
			if n := osworld.requests.Load(); n != int64(len(videoTypes)) {
				t.Errorf("OSWorld's way took %d requests, want %d", n, len(videoTypes))
			}
		})
	}
}

// scriptedGuest answers batches as a guest that runs at most perBatch
// commands of each, "out:" and the command line each; without perBatch
// (a guest without python3) it refuses them. A single command is answered
// the same way, refused when it is "refuse". It counts Execute calls.
type scriptedGuest struct {
	perBatch int
	garbled  bool  // a batch's output is not its JSON
	down     error // every call fails with it
	calls    int
}

func (g *scriptedGuest) File(context.Context, string) ([]byte, error) { return nil, ErrRefused }
func (g *scriptedGuest) Accessibility(context.Context) (string, error) {
	return "", ErrRefused
}

func (g *scriptedGuest) Execute(_ context.Context, argv []string, shell bool) (ExecResult, error) {
	g.calls++
	switch {
	case g.down != nil:
		return ExecResult{}, g.down
	case shell:
		return ExecResult{}, errors.New("a shell command")
	case argv[0] != "python3":
		if argv[0] == "refuse" {
			return ExecResult{}, fmt.Errorf("%w: HTTP 500", ErrRefused)
		}
		return ExecResult{Output: "out:" + strings.Join(argv, " ")}, nil
	case g.perBatch == 0:
		return ExecResult{}, fmt.Errorf("%w: HTTP 500: no python3", ErrRefused)
	case g.garbled:
		return ExecResult{Output: "Traceback", ReturnCode: 1}, nil
	}
	var req struct{ Commands [][]string }
	if err := json.Unmarshal([]byte(argv[3]), &req); err != nil {
		return ExecResult{}, err
	}
	var results []map[string]any
	for _, c := range req.Commands[:min(g.perBatch, len(req.Commands))] {
		if c[0] == "refuse" {
			results = append(results, map[string]any{"failed": "cannot run"})
			continue
		}
		results = append(results, map[string]any{"output": "out:" + strings.Join(c, " "), "error": "", "returncode": 0})
	}
	b, _ := json.Marshal(map[string]any{"results": results})
	return ExecResult{Output: string(b)}, nil
}

// TestExecuteEach: commands run in one request, in as many as a guest
// that cuts its batches short needs, or one each where the guest runs no
// batch; every way gives each command's own result, a command the guest
// refuses marked as such; a guest that cannot be reached is an error.
func TestExecuteEach(t *testing.T) {
	commands := [][]string{{"a", "1"}, {"refuse"}, {"b"}, {"c", "2"}, {"d"}}
	want := []commandResult{{ExecResult: ExecResult{Output: "out:a 1"}}, {refused: true},
		{ExecResult: ExecResult{Output: "out:b"}}, {ExecResult: ExecResult{Output: "out:c 2"}}, {ExecResult: ExecResult{Output: "out:d"}}}
	for _, tc := range []struct {
		name  string
		guest scriptedGuest
		calls int
	}{
		{"one batch", scriptedGuest{perBatch: 100}, 1},
		{"batches cut short", scriptedGuest{perBatch: 2}, 3},
		{"no python3", scriptedGuest{}, 1 + len(commands)},
		{"garbled batch", scriptedGuest{perBatch: 100, garbled: true}, 1 + len(commands)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := executeEach(t.Context(), &tc.guest, commands)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("executeEach = %+v, %v; want %+v", got, err, want)
			}
			if tc.guest.calls != tc.calls {
				t.Errorf("%d requests, want %d", tc.guest.calls, tc.calls)
			}
		})
	}
	down := errors.New("connection refused")
	if _, err := executeEach(t.Context(), &scriptedGuest{down: down}, commands); !errors.Is(err, down) {
		t.Errorf("an unreachable guest: %v, want its error", err)
	}
}

// BenchmarkDefaultVideoPlayer grades default_video_player against a
// loopback guest that runs the queries, every request delayed by 50 ms as
// a stand-in for the round trip to a VM: natively in one request; natively
// one request per type, where the guest runs no batch; and OSWorld's way,
// one request per type listed (the fixture checkout's getter, through the
// bridge).
func BenchmarkDefaultVideoPlayer(b *testing.B) {
	python := needPython(b)
	answers := map[string]mimeAnswer{}
	for _, typ := range distinctVideoTypes() {
		answers["video/"+typ] = mimeAnswer{out: "vlc.desktop\n"}
	}
	for _, way := range []struct {
		name     string
		mode     Mode
		noPython bool
	}{{"native one request", NativeOnly, false}, {"native one request per type", NativeOnly, true}, {"OSWorld one request per type listed", PreferBridge, false}} {
		b.Run(way.name, func(b *testing.B) {
			g := newExecGuest(b, python, answers)
			g.noPython, g.delay = way.noPython, 50*time.Millisecond
			gr := newNativeGrader(b, GraderConfig{OSWorldDir: fixtureDir(b), Python: python, Mode: way.mode,
				Env: Env{ServerPort: g.port(), Platform: "Linux"}, Guest: clientFor(b, g.srv.URL)})
			task := videoPlayerTask(b, "vlc.desktop\n")
			// The bridge's worker starts at the first grade: not timed.
			if s, err := gr.Grade(b.Context(), task, desktop.DoneAction); err != nil || s != 1 {
				b.Fatalf("grade: %v, %v", s, err)
			}
			g.requests.Store(0)
			for b.Loop() {
				if s, err := gr.Grade(b.Context(), task, desktop.DoneAction); err != nil || s != 1 {
					b.Fatalf("grade: %v, %v", s, err)
				}
			}
			b.ReportMetric(float64(g.requests.Load())/float64(b.N), "requests/op")
		})
	}
}

// TestBatchScript runs the guest's batch script itself: results in the
// commands' order whichever ends first, each command's output, error and
// exit code, a command that cannot start marked failed, "~/" expanded;
// and once its budget is spent it starts nothing but the first command.
func TestBatchScript(t *testing.T) {
	python := needPython(t)
	home := t.TempDir()
	run := func(budget float64, commands [][]string) []map[string]any {
		t.Helper()
		req, err := json.Marshal(map[string]any{"commands": commands, "budget": budget})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(t.Context(), python, "-c", batchScript, string(req))
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LC_ALL=C.UTF-8"}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("batch script: %v (%s)", err, out)
		}
		var ans struct{ Results []map[string]any }
		if err := json.Unmarshal(out, &ans); err != nil {
			t.Fatalf("batch script printed %q: %v", out, err)
		}
		return ans.Results
	}
	commands := [][]string{
		{"sh", "-c", "sleep 0.3; echo first"}, // ends last when run side by side
		{"sh", "-c", "echo second >&2; exit 3"},
		{filepath.Join(home, "no-such-program")},
		{"echo", "~/x"},
	}
	got := run(60, commands)
	want := []map[string]any{
		{"output": "first\n", "error": "", "returncode": float64(0)},
		{"output": "", "error": "second\n", "returncode": float64(3)},
		nil, // failed: checked below
		{"output": home + "/x\n", "error": "", "returncode": float64(0)},
	}
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		if w == nil {
			if msg, ok := got[i]["failed"].(string); !ok || !strings.Contains(msg, "no-such-program") {
				t.Errorf("result %d: %v; want failed, naming the program", i, got[i])
			}
			continue
		}
		if !maps.Equal(got[i], w) {
			t.Errorf("result %d: %v, want %v", i, got[i], w)
		}
	}
	if got := run(-1, commands); len(got) != 1 || got[0]["output"] != "first\n" {
		t.Errorf("budget spent: %v; want only the first command's result", got)
	}
}
