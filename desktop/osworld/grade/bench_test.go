package grade

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"legato/rl/desktop"
)

// Benchmarks of grading:
//
//	go test -run '^$' -bench . -benchtime 5x ./desktop/osworld/grade/
//
// BenchmarkPoolStart is what a batch waits for before its first grade
// through Python: a worker starting and importing every evaluator module,
// with the checkout's bytecode cached by an earlier run or not, and the
// memory it then holds. BenchmarkFirstGrade is a grader's first grade
// through Python: on a batch's warm pool, or on a pool of its own (start
// Python, import the metric's module). BenchmarkGrade compares later
// grades through a warm worker with native ones. LEGATO_OSWORLD_DIR
// benchmarks a real checkout instead of the fixture, LEGATO_PYTHON another
// interpreter, and LEGATO_BENCH_EVALUATOR (an evaluator's JSON) another
// metric through Python in BenchmarkFirstGrade.

func benchCheckout(b *testing.B) string {
	if dir := os.Getenv("LEGATO_OSWORLD_DIR"); dir != "" {
		return dir
	}
	return fixtureDir(b)
}

// benchTasks are an exact_match on rules (no I/O) and a diff_text_file on a
// file copied from the guest.
func benchTasks(b *testing.B, guest *fakeGuest) map[string]desktop.Task {
	var lines string
	for i := range 200 {
		lines += "line " + string(rune('a'+i%26)) + "\n"
	}
	guest.setFile("/home/user/a.txt", lines)
	guest.setFile("/home/user/b.txt", lines+"one more\n")
	return map[string]desktop.Task{
		"exact_match": {ID: "bench-exact", Evaluator: []byte(`{"func":"exact_match","result":{"type":"rule","rules":"100\n"},"expected":{"type":"rule","rules":{"expected":"100\n"}}}`)},
		"diff_text_file": {ID: "bench-diff", Evaluator: []byte(`{"func":"diff_text_file",
			"result":{"type":"vm_file","path":"/home/user/a.txt","dest":"a.txt"},
			"expected":{"type":"vm_file","path":"/home/user/b.txt","dest":"b.txt"}}`)},
	}
}

func BenchmarkPoolStart(b *testing.B) {
	python := needPython(b)
	ctx := context.Background()
	start := func(b *testing.B, bytecode string) *Pool {
		p, err := NewPool(PoolConfig{OSWorldDir: benchCheckout(b), Python: python, Workers: 1, BytecodeDir: bytecode})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.waitRunning(ctx); err != nil {
			b.Fatal(err)
		}
		return p
	}
	for _, cached := range []bool{true, false} {
		name := "bytecode-cold"
		if cached {
			name = "bytecode-cached"
		}
		b.Run(name, func(b *testing.B) {
			cache := b.TempDir()
			if cached {
				start(b, cache).Close()
			}
			var rss int64
			for b.Loop() {
				dir := cache
				if !cached {
					dir = b.TempDir()
				}
				p := start(b, dir)
				if st := p.Stats(); len(st.RSS) == 1 {
					rss = st.RSS[0]
				}
				p.Close()
			}
			b.ReportMetric(float64(rss)/(1<<20), "MiB/worker")
		})
	}
}

// benchFirstTask is what BenchmarkFirstGrade grades through Python.
func benchFirstTask(b *testing.B) desktop.Task {
	ev := os.Getenv("LEGATO_BENCH_EVALUATOR")
	if ev == "" {
		ev = `{"func":"exact_match","result":{"type":"rule","rules":"100\n"},"expected":{"type":"rule","rules":{"expected":"100\n"}}}`
	}
	return desktop.Task{ID: "bench-first", Evaluator: []byte(ev)}
}

func BenchmarkFirstGrade(b *testing.B) {
	python := needPython(b)
	task := benchFirstTask(b)
	ctx := context.Background()
	pool, err := NewPool(PoolConfig{OSWorldDir: benchCheckout(b), Python: python, Workers: 1, BytecodeDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	cat, err := LoadCatalog(ctx, GraderConfig{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	if err := pool.waitRunning(ctx); err != nil {
		b.Fatal(err)
	}
	grade := func(b *testing.B, cfg GraderConfig) {
		cfg.Catalog, cfg.CacheDir = cat, b.TempDir()
		g, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		r, err := g.Evaluate(ctx, task, desktop.DoneAction)
		if err != nil || len(r.Metrics) == 0 || r.Metrics[0].Via != ViaPython {
			b.Fatalf("Evaluate = %+v, %v; want a grade through Python", r, err)
		}
	}
	b.Run("warm-pool", func(b *testing.B) {
		for b.Loop() {
			grade(b, GraderConfig{Pool: pool})
		}
	})
	b.Run("own-pool", func(b *testing.B) {
		bytecode := b.TempDir()
		for b.Loop() {
			grade(b, GraderConfig{OSWorldDir: benchCheckout(b), Python: python, BytecodeDir: bytecode})
		}
	})
}

func BenchmarkGrade(b *testing.B) {
	python := needPython(b)
	guest := newFakeGuest(b)
	tasks := benchTasks(b, guest)
	pool, err := NewPool(PoolConfig{OSWorldDir: benchCheckout(b), Python: python, Workers: 1, BytecodeDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, metric := range []string{"exact_match", "diff_text_file"} {
		for _, mode := range []Mode{PreferBridge, NativeOnly} {
			b.Run(metric+"/"+mode.String(), func(b *testing.B) {
				g, err := New(GraderConfig{
					Pool: pool, Mode: mode, CacheDir: b.TempDir(),
					Env: Env{ServerPort: guest.port()}, Guest: guest.client(b),
				})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				task := tasks[metric]
				// Warm: the worker runs and has imported the module.
				if _, err := g.Grade(context.Background(), task, desktop.DoneAction); err != nil {
					b.Fatal(err)
				}
				// CPU time of both processes is steadier than wall time on a
				// shared machine.
				cpu0 := cpuTime(b, g)
				for b.Loop() {
					if _, err := g.Grade(context.Background(), task, desktop.DoneAction); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpuTime(b, g)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// cpuTime is the CPU time used so far by this process and g's worker.
func cpuTime(b *testing.B, g *Grader) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if g.pool == nil || g.cfg.Mode == NativeOnly {
		return total
	}
	pid := int(g.pool.workers[0].pid.Load())
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the parenthesized command name; utime and stime are the
	// 14th and 15th fields, in clock ticks (100 per second on Linux).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.Atoi(fields[11])
	stime, _ := strconv.Atoi(fields[12])
	return total + time.Duration(utime+stime)*10*time.Millisecond
}
