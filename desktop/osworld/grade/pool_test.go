package grade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop"
)

func newTestPool(t testing.TB, workers int) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{OSWorldDir: fixtureDir(t), Python: needPython(t), Workers: workers, BytecodeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestPoolServesABatchOf64Desktops grades on 64 graders at once, as the
// desktops of a batch do, through one pool of 3 processes: every grade is
// right, says it ran through Python, and no grader started a process of
// its own.
func TestPoolServesABatchOf64Desktops(t *testing.T) {
	pool := newTestPool(t, 3)
	guest := newFakeGuest(t)
	cat, err := LoadCatalog(context.Background(), GraderConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	const desktops = 64
	var wg sync.WaitGroup
	errs := make(chan error, 3*desktops) // one per grade: a send never blocks
	for d := range desktops {
		g := newNativeGrader(t, GraderConfig{Pool: pool, Catalog: cat, Env: Env{ServerPort: guest.port()}, Guest: guest.client(t)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 {
				want := fmt.Sprintf("desktop %d grade %d", d, i)
				ev := evaluator(t, map[string]any{
					"func":     []string{"exact_match", "write_relative"},
					"result":   []any{rule(want), rule(want)},
					"expected": []any{rule(map[string]any{"expected": want}), rule(map[string]any{})},
				})
				r, err := g.Evaluate(context.Background(), desktop.Task{ID: "batch", Evaluator: ev}, desktop.DoneAction)
				shown := "'" + want + "'"
				wantRuns := []desktop.MetricRun{{Metric: "exact_match", Via: ViaPython, ResultGetter: "rule", ResultValue: shown},
					{Metric: "write_relative", Via: ViaPython, ResultGetter: "rule", ResultValue: shown}}
				switch {
				case err != nil:
					errs <- err
				case r.Score != 1:
					errs <- fmt.Errorf("%s: score %v, want 1", want, r.Score)
				case !cmp.Equal(wantRuns, r.Metrics, cmpopts.IgnoreFields(desktop.MetricRun{}, "Result", "Expected")):
					errs <- fmt.Errorf("%s: runs %v, want %v", want, r.Metrics, wantRuns)
				case r.Metrics[0].Result == "" || r.Metrics[0].Expected == "":
					errs <- fmt.Errorf("%s: runs %+v, want digests of both values", want, r.Metrics)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := pool.waitRunning(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := pool.Stats()
	if st.Starts != 3 || st.Running != 3 {
		t.Errorf("pool stats %+v: want 3 processes started, 3 running", st)
	}
	if len(st.RSS) != 3 || st.RSS[0] <= 0 {
		t.Errorf("RSS %v, want one positive size per process", st.RSS)
	}
}

// TestPoolReplacesAWorkerThatDies: the grade in flight is tried again on a
// new process and scores; a grade that kills every process it runs on
// fails after its second try, naming the metric.
func TestPoolReplacesAWorkerThatDies(t *testing.T) {
	pool := newTestPool(t, 2)
	g := newNativeGrader(t, GraderConfig{Pool: pool})
	marker := filepath.Join(t.TempDir(), "crashed")
	task := desktop.Task{ID: "flaky", Evaluator: evaluator(t, map[string]any{
		"func": "crash_once", "result": rule(nil), "expected": rule(map[string]any{"marker": marker})})}
	if err := pool.waitRunning(context.Background()); err != nil {
		t.Fatal(err) // both workers up: the counts below are replacements
	}
	got, err := g.Grade(context.Background(), task, desktop.DoneAction)
	if err != nil || got != 1 {
		t.Fatalf("Grade = %v, %v; want 1 from the second try", got, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the metric never ran its first, crashing, time: %v", err)
	}

	dies := desktop.Task{ID: "dies", Evaluator: evaluator(t, map[string]any{"func": "exit_process", "result": rule("x")})}
	_, err = g.Grade(context.Background(), dies, desktop.DoneAction)
	var ge *Error
	if !errors.As(err, &ge) || ge.Metric != "exit_process" || !errors.Is(err, ErrBridgeExited) || !strings.Contains(err.Error(), "second try") {
		t.Fatalf("Grade = %v, want an *Error naming exit_process after a second try", err)
	}
	if !desktop.IsFailure(context.Background(), err) {
		t.Errorf("IsFailure = false for %v", err)
	}
	// One replacement for crash_once, two for exit_process, on top of the
	// two first processes; the pool is whole again. The last replacement
	// may start after the grade's error came back: wait for it (the bound
	// only keeps a pool that never gets there from hanging the test).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pool.waitStats(ctx, func(st PoolStats) bool { return st.Starts >= 5 && st.Running == 2 }); err != nil {
		t.Fatalf("pool stats %+v: want 5 processes started and 2 running (%v)", pool.Stats(), err)
	}
	if st := pool.Stats(); st.Starts != 5 {
		t.Errorf("pool stats %+v: want 5 processes started", st)
	}
	if got, err := g.Grade(context.Background(), task, desktop.DoneAction); err != nil || got != 1 {
		t.Errorf("next Grade = %v, %v; want 1", got, err)
	}
}

// TestGraderCloseLeavesASharedPool: a desktop's grader closing does not
// stop the pool the other desktops grade with.
func TestGraderCloseLeavesASharedPool(t *testing.T) {
	pool := newTestPool(t, 1)
	task := desktop.Task{ID: "ok", Evaluator: evaluator(t, map[string]any{"func": "always_one", "result": rule(nil)})}
	a := newNativeGrader(t, GraderConfig{Pool: pool})
	if _, err := a.Grade(context.Background(), task, desktop.DoneAction); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b := newNativeGrader(t, GraderConfig{Pool: pool})
	if got, err := b.Grade(context.Background(), task, desktop.DoneAction); err != nil || got != 1 {
		t.Fatalf("Grade after another grader closed = %v, %v; want 1", got, err)
	}
	if st := pool.Stats(); st.Starts != 1 {
		t.Errorf("%d processes started, want 1", st.Starts)
	}
	pool.Close()
	if _, err := b.Grade(context.Background(), task, desktop.DoneAction); !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Grade after the pool closed = %v, want ErrClosed", err)
	}
}

// TestPoolCompilesTheCheckoutOnce: the checkout's bytecode lands in the
// pool's bytecode directory, not in the checkout, and a second pool on the
// same directory finds it there.
func TestPoolCompilesTheCheckoutOnce(t *testing.T) {
	checkout := t.TempDir()
	if err := os.CopyFS(checkout, os.DirFS(fixtureDir(t))); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	pycs := func() []string {
		var out []string
		for _, root := range []string{checkout, cache} {
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && strings.HasSuffix(p, ".pyc") {
					out = append(out, p)
				}
				return nil
			})
		}
		return out
	}
	// Python replaces a bytecode file it writes; the same file, unchanged,
	// means it was read.
	written := map[string]os.FileInfo{}
	for run := range 2 {
		p, err := NewPool(PoolConfig{OSWorldDir: checkout, Python: needPython(t), Workers: 1, BytecodeDir: cache})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCatalog(context.Background(), GraderConfig{Pool: p}); err != nil {
			t.Fatal(err)
		}
		p.Close()
		files := pycs()
		if len(files) == 0 {
			t.Fatal("no bytecode written")
		}
		for _, f := range files {
			if !strings.HasPrefix(f, filepath.Join(cache, checkout)+string(filepath.Separator)) {
				t.Errorf("bytecode %s is outside %s", f, filepath.Join(cache, checkout))
			}
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if run == 0 {
				written[f] = st
			} else if !os.SameFile(written[f], st) || !st.ModTime().Equal(written[f].ModTime()) {
				t.Errorf("%s compiled again by the second pool", f)
			}
		}
	}
}

// TestGraderWorksFromAnyDirectory: relative paths in the configuration are
// taken from the working directory at New, and the bridge starts however
// they are given.
func TestGraderWorksFromAnyDirectory(t *testing.T) {
	python := needPython(t)
	fixture := fixtureDir(t)
	work := t.TempDir()
	t.Chdir(work)
	rel, err := filepath.Rel(work, fixture)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(GraderConfig{OSWorldDir: rel, Python: python, CacheDir: "cache", BytecodeDir: "pycache", DownloadDir: "downloads"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	task := desktop.Task{ID: "rel", Evaluator: evaluator(t, map[string]any{
		"func": "exact_match", "result": rule("a"), "expected": rule(map[string]any{"expected": "a"})})}
	if got, err := g.Grade(context.Background(), task, desktop.DoneAction); err != nil || got != 1 {
		t.Fatalf("Grade = %v, %v; want 1", got, err)
	}
	if _, err := os.Stat(filepath.Join(work, "pycache")); err != nil {
		t.Errorf("bytecode not cached under the relative BytecodeDir: %v", err)
	}
}
