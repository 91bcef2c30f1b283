package rl

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// BenchmarkCollectStop stops a batch of 55,040 attempts (1,720 tasks × 32)
// that keeps every desktop busy, as a SIGTERM does, once its first records
// are committed, and measures the stop in real time (not in a bubble: the
// stop is CPU and scheduling, which a fake clock hides):
//
//	stop-s      from the cancel to Collect's return
//	stop-cpu-s  user+system CPU of the process in that time
//	appended    records committed after the cancel (finished tries are kept)
//
// It fails when the final summary does not count every line of
// rollouts.jsonl. Desktops are created at once and the model answers in a
// flat 200 ms, so the batch is busy within a minute at 4,096 desktops; on a
// loaded machine stop-s is mostly the wait for a CPU, stop-cpu-s is not.
func BenchmarkCollectStop(b *testing.B) {
	for _, d := range []int{1024, MaxDesktops} {
		b.Run("desktops="+strconv.Itoa(d), func(b *testing.B) {
			var stop, cpu time.Duration
			appended := 0
			for b.Loop() {
				r := runStoppedBatch(b, d)
				stop += r.stop
				cpu += r.cpu
				appended += r.appended
			}
			n := float64(b.N)
			b.ReportMetric(stop.Seconds()/n, "stop-s")
			b.ReportMetric(cpu.Seconds()/n, "stop-cpu-s")
			b.ReportMetric(float64(appended)/n, "appended")
		})
	}
}

type stopResult struct {
	stop, cpu time.Duration
	appended  int
}

// runStoppedBatch runs the batch of BenchmarkCollectStop on desktops
// desktops and cancels it after its 20th commit.
func runStoppedBatch(b *testing.B, desktops int) stopResult {
	dir := filepath.Join(b.TempDir(), "run")
	srv := policytest.NewPipeServer(policytest.Options{Workers: 4,
		Latency: policytest.Latency{Base: 200 * time.Millisecond, Knee: 1 << 20, Capacity: 1 << 20}})
	defer srv.Close()
	ms := func(n int) fake.Latency { return fake.Latency{Fixed: time.Duration(n) * time.Millisecond} }
	fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, DefaultReward: fake.Reward{P: 0.5},
		Latency: fake.Latencies{Reset: ms(300), WaitAfterReset: ms(100), Observe: ms(20), Act: ms(50),
			Settle: ms(150), WaitBeforeEval: ms(50), Evaluate: ms(100)}})
	lines := func() int {
		data, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
		if err != nil {
			b.Fatal(err)
		}
		return bytes.Count(data, []byte("\n"))
	}

	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	var (
		mu      sync.Mutex
		commits int
		at      time.Time
		cpuAt   time.Duration
		before  int
	)
	cancelled := make(chan struct{})
	opts := CollectOptions{Out: dir, NewDesktop: fleet.New, Desktops: desktops, Group: 32, MaxSteps: 15,
		OnCommitted: func(time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if commits++; commits != 20 {
				return
			}
			// Not here: the committing goroutine would wait for it.
			go func() {
				n := lines()
				mu.Lock()
				before, at, cpuAt = n, time.Now(), cpuTime()
				mu.Unlock()
				cancel()
				close(cancelled)
			}()
		}}
	pol := PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "stop", StepTimeout: time.Hour, HTTPClient: srv.Client()}
	sum, err := Collect(ctx, testTasks(1720), pol, opts)
	end, cpuEnd := time.Now(), cpuTime()
	if !errors.Is(err, context.Canceled) {
		b.Fatalf("Collect: %v; want it cancelled (the batch ended before its 20th commit?)", err)
	}
	<-cancelled
	after := lines()
	if sum.Records != after || !sum.Final {
		b.Fatalf("final summary counts %d records (final %v); rollouts.jsonl has %d lines", sum.Records, sum.Final, after)
	}
	mu.Lock()
	defer mu.Unlock()
	return stopResult{stop: end.Sub(at), cpu: cpuEnd - cpuAt, appended: after - before}
}
