package grade

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/desktop"
)

// TestInputDigestFollowsContent: a file the value names in the cache
// directory counts by its content, wherever the cache is; a path outside
// it counts as the string it is.
func TestInputDigestFollowsContent(t *testing.T) {
	write := func(dir, name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := t.TempDir(), t.TempDir()
	list := func(dir, content string) any {
		d := newPyDict()
		d.set("files", []any{write(dir, "x.txt", content), "label"})
		return d
	}
	if inputDigest(list(a, "same"), a) != inputDigest(list(b, "same"), b) {
		t.Error("the same file content in two cache directories digests differently")
	}
	if inputDigest(list(a, "same"), a) == inputDigest(list(b, "other"), b) {
		t.Error("another file content digests the same")
	}
	outside := write(t.TempDir(), "y.txt", "same")
	if inputDigest(outside, a) == inputDigest(filepath.Join(a, "x.txt"), a) {
		t.Error("a file outside the cache directory was digested by its content")
	}
	if got, want := inputDigest("plain", a), inputDigest("plain", b); got != want || len(got) != 64 {
		t.Errorf("a plain string digests as %q and %q", got, want)
	}
}

// TestInputDigestsAgree grades tasks natively and through the fixture
// checkout's Python getters and metrics, against the same fake guest: both
// give the same digests of the values the metric took and show the same
// text of the result, graders with caches
// of their own give them again, and a file changed in the guest changes
// its value's digest and only that one.
func TestInputDigestsAgree(t *testing.T) {
	python := needPython(t)
	tasks := []desktop.Task{
		{ID: "files", Evaluator: []byte(`{"func":"compare_text_file",
			"result":{"type":"vm_file","path":"/home/user/a.txt","dest":"a.txt"},
			"expected":{"type":"vm_file","path":"/home/user/b.txt","dest":"b.txt"}}`)},
		{ID: "command", Evaluator: []byte(`{"func":"exact_match",
			"result":{"type":"vm_command_line","command":"cat /home/user/a.txt","shell":true},
			"expected":{"type":"rule","rules":{"expected":"x y\n"}}}`)},
		{ID: "nested", Evaluator: []byte(`{"func":"check_include_exclude",
			"result":{"type":"rule","rules":"<desktop-frame name=\"é\"/>"},
			"expected":{"type":"rule","rules":{"include":["<desktop", "é"],"exclude":[],"n":[1,2.5,true,null]}}}`)},
	}
	guest := newFakeGuest(t)
	guest.setFile("/home/user/a.txt", "x y\n")
	guest.setFile("/home/user/b.txt", "x y\n")
	guest.setCommand("cat /home/user/a.txt", true, "x y\n")
	grade := func(mode Mode, task desktop.Task) desktop.MetricRun {
		t.Helper()
		g := newNativeGrader(t, GraderConfig{OSWorldDir: fixtureDir(t), Python: python, Mode: mode,
			Env: Env{ServerPort: guest.port()}, Guest: guest.client(t)})
		r, err := g.Evaluate(context.Background(), task, desktop.DoneAction)
		if err != nil || len(r.Metrics) != 1 {
			t.Fatalf("%s %v: %+v, %v", task.ID, mode, r, err)
		}
		m := r.Metrics[0]
		if len(m.Result) != 64 || len(m.Expected) != 64 {
			t.Fatalf("%s %v: digests %q and %q, want two", task.ID, mode, m.Result, m.Expected)
		}
		return m
	}
	// What each shows of its result: the text its digest is of.
	want := map[string]string{
		"files":   "'file sha256:" + textDigest("x y\n") + "'",
		"command": `'x y\n'`,
		"nested":  `'<desktop-frame name="é"/>'`,
	}
	for _, task := range tasks {
		native, python := grade(NativeOnly, task), grade(PreferBridge, task)
		if native.Via != ViaNative || python.Via != ViaPython {
			t.Fatalf("%s: ran %s and %s, want native and python", task.ID, native.Via, python.Via)
		}
		if native.Result != python.Result || native.Expected != python.Expected {
			t.Errorf("%s: native digests %s %s, python %s %s", task.ID, native.Result, native.Expected, python.Result, python.Expected)
		}
		if native.ResultValue != want[task.ID] || python.ResultValue != want[task.ID] || native.ResultGetter != python.ResultGetter {
			t.Errorf("%s: native shows %s %q, python %s %q; want %q", task.ID, native.ResultGetter, native.ResultValue, python.ResultGetter, python.ResultValue, want[task.ID])
		}
		if again := grade(NativeOnly, task); again != native {
			t.Errorf("%s: graded again %+v, first %+v", task.ID, again, native)
		}
	}
	first := grade(NativeOnly, tasks[0])
	guest.setFile("/home/user/a.txt", "x  y\n")
	for _, mode := range []Mode{NativeOnly, PreferBridge} {
		if m := grade(mode, tasks[0]); m.Result == first.Result || m.Expected != first.Expected {
			t.Errorf("%v after the result file changed: %+v, before %+v; want the result's digest alone changed", mode, m, first)
		}
	}
}

// TestShown: a result's text is shown whole up to 200 characters, and cut
// there, by characters and not bytes, with the cut marked.
func TestShown(t *testing.T) {
	long := strings.Repeat("é", 250)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"'vlc.desktop\\n'", "'vlc.desktop\\n'"},
		{strings.Repeat("x", 200), strings.Repeat("x", 200)},
		{strings.Repeat("x", 201), strings.Repeat("x", 200) + "…"},
		{long, strings.Repeat("é", 200) + "…"},
	} {
		if got := shown(tc.in); got != tc.want {
			t.Errorf("shown(%.20q…) = %.20q… (%d bytes), want %.20q… (%d bytes)", tc.in, got, len(got), tc.want, len(tc.want))
		}
	}
}
