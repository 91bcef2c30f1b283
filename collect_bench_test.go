package rl

import (
	"encoding/base64"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// Benchmarks run whole batches in a testing/synctest bubble: desktop and
// model latencies pass on the bubble's fake clock, so a batch of hours
// runs in the time its CPU work takes, and the fake makespan is what the
// schedule alone gives. Results are reported as metrics:
//
//	makespan-s     fake seconds from Collect's call to its return
//	makespan/lb    the makespan over its lower bound (see benchResult)
//	rollouts/h     graded attempts per fake hour
//	cpu-s/1000steps  user+system CPU seconds of the process per 1,000 model calls

// inBubble runs f in a synctest bubble from a benchmark. synctest.Test
// wants a *testing.T, which a benchmark does not have; testing.RunTests
// makes one (matching any -run pattern, so that `-run '^$' -bench` works).
func inBubble(b *testing.B, f func(t *testing.T)) {
	b.Helper()
	ok := testing.RunTests(func(string, string) (bool, error) { return true, nil },
		[]testing.InternalTest{{Name: "batch", F: func(t *testing.T) { synctest.Test(t, f) }}})
	if !ok {
		b.Fatal("the batch failed (see above)")
	}
}

// benchBatch describes a benchmark batch.
type benchBatch struct {
	tasks, group, desktops, maxSteps int
	oversample                       float64
	// fullScreen uses the fake's 1920×1080 screens, which the Qwen harness
	// resizes, instead of small ones it sends as they are.
	fullScreen  bool
	desk        fake.Latencies
	server      policytest.Latency
	maxInflight int
	seed        uint64
}

// benchResult is what one batch did.
type benchResult struct {
	makespan time.Duration
	// lowerBound is the most of: the longest finished attempt, and the
	// finished attempts' time spread over every desktop. No schedule of
	// these attempts ends sooner.
	lowerBound time.Duration
	steps      int
	graded     int
	cpu        time.Duration
}

func (bb benchBatch) run(t *testing.T, dir string) benchResult {
	srv := policytest.NewPipeServer(policytest.Options{Latency: bb.server})
	defer srv.Close()
	cfg := fake.Config{Seed: bb.seed, Latency: bb.desk, DefaultReward: fake.Reward{P: 0.5}}
	if !bb.fullScreen {
		cfg.Width, cfg.Height = testWidth, testHeight
	}
	fleet := fake.NewFleet(cfg)
	pol := PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "bench", StepTimeout: time.Hour,
		MaxInflight: bb.maxInflight, HTTPClient: srv.Client()}
	opts := CollectOptions{Out: dir, NewDesktop: fleet.New, Desktops: bb.desktops, Group: bb.group,
		Oversample: bb.oversample, MaxSteps: bb.maxSteps}
	cpu0 := cpuTime()
	start := time.Now()
	sum, err := Collect(t.Context(), testTasks(bb.tasks), pol, opts)
	res := benchResult{makespan: time.Since(start), cpu: cpuTime() - cpu0}
	if err != nil {
		t.Fatal(err)
	}
	var longest, work float64
	if _, err := schema.ReadRunRecords(dir, func(r schema.Record) error {
		if r.Status.Finished() {
			longest = max(longest, r.Timing.TotalS)
			work += r.Timing.TotalS
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res.lowerBound = time.Duration(max(longest, work/float64(bb.desktops)) * float64(time.Second))
	res.steps = sum.ModelCalls
	for s, n := range sum.Counts {
		if s.Graded() {
			res.graded += n
		}
	}
	return res
}

// cpuTime is the user and system CPU time of the process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runBench runs bb b.N times, with seeds 1 to b.N, and reports the means.
func runBench(b *testing.B, bb benchBatch) {
	var sum benchResult
	var ratio float64
	for i := 0; b.Loop(); i++ {
		bb.seed = uint64(i + 1)
		dir := filepath.Join(b.TempDir(), "run")
		var r benchResult
		inBubble(b, func(t *testing.T) { r = bb.run(t, dir) })
		sum.makespan += r.makespan
		sum.steps += r.steps
		sum.graded += r.graded
		sum.cpu += r.cpu
		ratio += r.makespan.Seconds() / r.lowerBound.Seconds()
	}
	n := float64(b.N)
	b.ReportMetric(sum.makespan.Seconds()/n, "makespan-s")
	b.ReportMetric(ratio/n, "makespan/lb")
	b.ReportMetric(float64(sum.graded)/sum.makespan.Hours(), "rollouts/h")
	b.ReportMetric(sum.cpu.Seconds()/float64(sum.steps)*1000, "cpu-s/1000steps")
}

// vmLatencies are a KVM desktop's, roughly: reset ≈ 2 s, act ≈ 0.3 s, a
// screenshot 0.1 s, up to 1 s for the screen to settle, grading ≈ 1 s.
func vmLatencies() fake.Latencies {
	return fake.Latencies{
		Reset:    fake.Latency{Median: 2 * time.Second, Sigma: 0.25},
		Observe:  fake.Latency{Fixed: 100 * time.Millisecond},
		Act:      fake.Latency{Median: 300 * time.Millisecond, Sigma: 0.25},
		Settle:   fake.Latency{Max: time.Second},
		Evaluate: fake.Latency{Median: time.Second, Sigma: 0.5},
	}
}

// flatModel answers in about 2 s however many calls are in flight.
var flatModel = policytest.Latency{Base: 2 * time.Second, Knee: 1 << 20, Capacity: 1 << 20}

// BenchmarkCollect1000Desktops runs 2,000 attempts on 1,000 desktops with
// VM-like latencies and a model answering in about 2 s: the CPU the
// scheduler, harness, run store (and the in-process scripted server and
// fake desktops) spend per step, and how close the schedule comes to its
// bound. Screens are 320×192, which the Qwen harness sends as they are;
// BenchmarkCollectFullScreen measures what resizing real screenshots adds.
func BenchmarkCollect1000Desktops(b *testing.B) {
	runBench(b, benchBatch{tasks: 500, group: 4, desktops: 1000, maxSteps: 15,
		desk: vmLatencies(), server: flatModel})
}

// BenchmarkCollectFullScreen is BenchmarkCollect1000Desktops with 48
// desktops and 1920×1080 screens, which the Qwen harness resizes to
// 1920×1088 on every step.
func BenchmarkCollectFullScreen(b *testing.B) {
	runBench(b, benchBatch{tasks: 12, group: 4, desktops: 48, maxSteps: 15, fullScreen: true,
		desk: vmLatencies(), server: flatModel})
}

// BenchmarkCollectHeavyTail runs groups whose attempts now and then take
// minutes (a Pareto tail on every action, as when a VM stalls), with and
// without oversampling: with oversample, a group closes on its G fastest
// attempts and the stragglers are cancelled.
func BenchmarkCollectHeavyTail(b *testing.B) {
	desk := vmLatencies()
	desk.Act = fake.Latency{Fixed: 200 * time.Millisecond, Alpha: 1.1, Scale: 100 * time.Millisecond, Cap: 10 * time.Minute}
	for _, o := range []float64{0, 0.25} {
		b.Run("oversample="+strconv.FormatFloat(o, 'g', -1, 64), func(b *testing.B) {
			runBench(b, benchBatch{tasks: 32, group: 8, desktops: 64, maxSteps: 15, oversample: o,
				desk: desk, server: flatModel})
		})
	}
}

// BenchmarkCollectSaturatedServer runs 128 desktops against one server
// whose throughput collapses past 64 calls in flight (policytest's default
// H100-shaped model), with and without a cap on calls in flight.
func BenchmarkCollectSaturatedServer(b *testing.B) {
	for _, n := range []int{0, 32} {
		b.Run("max-inflight="+strconv.Itoa(n), func(b *testing.B) {
			runBench(b, benchBatch{tasks: 64, group: 4, desktops: 128, maxSteps: 15, maxInflight: n,
				desk: vmLatencies()})
		})
	}
}

// BenchmarkStorePrompt measures storing the prompts of one 15-step attempt
// whose screenshots are 1.5 MB each (a real 1920×1080 desktop; the fake's
// flat screens compress to a few KB): PutMessages on every whole prompt,
// which decodes and hashes every screenshot of the history again on every
// step, against storePrompt, which stores only what the prompt added.
func BenchmarkStorePrompt(b *testing.B) {
	const steps, imageBytes = 15, 1500 << 10
	images := make([]string, steps)
	for i := range images {
		png := make([]byte, imageBytes)
		copy(png, "\x89PNG\r\n\x1a\n")
		for j := 8; j < len(png); j += 8 {
			png[j] = byte(i*31 + j) // distinct, incompressible enough
		}
		images[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
	}
	prompts := make([][]schema.Message, steps)
	history := []schema.Message{{Role: "system", Content: []schema.Part{schema.TextPart("You use a computer.")}}}
	for i := range steps {
		history = append(history, schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(images[i])}})
		prompts[i] = slices.Clone(history)
		history = append(history, schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(fmt.Sprintf("step %d", i))}})
	}
	for _, whole := range []bool{true, false} {
		name := map[bool]string{true: "whole-prompt", false: "new-messages"}[whole]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				run, err := schema.Create(filepath.Join(b.TempDir(), "run"))
				if err != nil {
					b.Fatal(err)
				}
				r := &try{b: &batch{store: run}}
				b.StartTimer()
				for _, p := range prompts {
					if whole {
						_, err = run.PutMessages(p)
					} else {
						_, err = r.storePrompt(p)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				run.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*steps), "ms/step")
		})
	}
}

// BenchmarkCommitLatency runs 1,000 attempts at once on 1,000 instant
// desktops (no desktop or model latency: the batch is all CPU and disk, in
// real time) and reports how long finished tries' records took from their
// hand-over to being durable (commit-p50-ms, commit-p99-ms,
// commit-max-ms), and graded attempts per second. The desktop of a
// finished try takes its next attempt at hand-over, not at commit.
func BenchmarkCommitLatency(b *testing.B) {
	const tasks, group, desktops, maxSteps = 250, 4, 1000, 5
	var waits []time.Duration
	var mu sync.Mutex
	graded := 0
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "run")
		// Two workers per CPU: the scripted server stands in for one on
		// its own machine (policytest.Options.Workers).
		srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Workers: 2 * runtime.GOMAXPROCS(0)})
		fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, DefaultReward: fake.Reward{P: 0.5}, ReadyWaiter: true, Stepper: true})
		pol := PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "bench", StepTimeout: time.Hour, HTTPClient: srv.Client()}
		opts := CollectOptions{Out: dir, NewDesktop: fleet.New, Desktops: desktops, Group: group, MaxSteps: maxSteps,
			OnCommitted: func(d time.Duration) {
				mu.Lock()
				waits = append(waits, d)
				mu.Unlock()
			}}
		b.StartTimer()
		start := time.Now()
		sum, err := Collect(b.Context(), testTasks(tasks), pol, opts)
		elapsed += time.Since(start)
		srv.Close()
		if err != nil {
			b.Fatal(err)
		}
		for s, n := range sum.Counts {
			if s.Graded() {
				graded += n
			}
		}
	}
	if len(waits) == 0 {
		b.Fatal("no record committed")
	}
	slices.Sort(waits)
	ms := func(q float64) float64 { return float64(waits[int(q*float64(len(waits)-1))].Microseconds()) / 1e3 }
	b.ReportMetric(ms(0.5), "commit-p50-ms")
	b.ReportMetric(ms(0.99), "commit-p99-ms")
	b.ReportMetric(ms(1), "commit-max-ms")
	b.ReportMetric(float64(graded)/elapsed.Seconds(), "rollouts/s")
}
