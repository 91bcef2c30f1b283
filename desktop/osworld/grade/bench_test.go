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

// Benchmarks of one grade:
//
//	go test -run '^$' -bench . -benchtime 20x ./desktop/osworld/grade/
//
// BenchmarkBridgeFirstGrade pays for starting Python and importing the
// metric's module (with a catalog given, as in a batch; or listing the
// checkout itself, which imports every module); BenchmarkGrade compares
// later grades through the warm bridge with native ones. LEGATO_OSWORLD_DIR
// benchmarks a real checkout instead of the fixture.

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

func BenchmarkBridgeFirstGrade(b *testing.B) {
	python := needPython(b)
	guest := newFakeGuest(b)
	task := benchTasks(b, guest)["exact_match"]
	base := GraderConfig{OSWorldDir: benchCheckout(b), Python: python, Env: Env{ServerPort: guest.port()}}
	cat, err := LoadCatalog(context.Background(), base)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		catalog *Catalog
	}{{"catalog-given", cat}, {"lists-checkout", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				cfg := base
				cfg.Catalog = tc.catalog
				g, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				if s, err := g.Grade(context.Background(), task, desktop.DoneAction); err != nil || s != 1 {
					b.Fatalf("Grade = %v, %v", s, err)
				}
				g.Close()
			}
		})
	}
}

func BenchmarkGrade(b *testing.B) {
	python := needPython(b)
	guest := newFakeGuest(b)
	tasks := benchTasks(b, guest)
	for _, metric := range []string{"exact_match", "diff_text_file"} {
		for _, mode := range []Mode{PreferBridge, NativeOnly} {
			b.Run(metric+"/"+mode.String(), func(b *testing.B) {
				g, err := New(GraderConfig{
					OSWorldDir: benchCheckout(b), Python: python, Mode: mode,
					Env: Env{ServerPort: guest.port()}, Guest: guest.client(b),
				})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				task := tasks[metric]
				// Warm: the process runs and the module is imported.
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

// cpuTime is the CPU time used so far by this process and g's bridge.
func cpuTime(b *testing.B, g *Grader) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if g.pool == nil {
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
