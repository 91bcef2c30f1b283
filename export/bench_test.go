package export_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"legato/rl/export"
	"legato/rl/internal/benchrun"
	"legato/rl/schema"
)

// peakHeap samples the heap in use until stop is closed and returns the
// largest value seen.
func peakHeap(stop <-chan struct{}) uint64 {
	var peak uint64
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var ms runtime.MemStats
	for {
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		select {
		case <-stop:
			return peak
		case <-tick.C:
		}
	}
}

// BenchmarkExportSteps exports a synthetic run of 10,000 rollouts × 15
// steps (groups of 8) with image references, and reports the JSONL
// written per second and the peak heap in use during the export. Run it
// with -benchtime=1x: one export writes about a gigabyte.
func BenchmarkExportSteps(b *testing.B) {
	run := benchrun.Run{Rollouts: 10_000, Steps: 15, Group: 8}
	benchExport(b, run, generate(b, b, run, "LEGATO_EXPORT_BENCH_RUN"), export.Options{})
}

// BenchmarkExportPromptIDs exports 2,000 rollouts × 15 steps whose samples
// carry their prompts' token ids (2,000 + 300 a step), in each export
// shape: per-step samples with whole prompts (about a gigabyte of JSONL,
// most of it ids), with prompt prefixes, and contiguous sequences; and
// per-step samples from a run whose objects are loose files. Run it with
// -benchtime=1x.
func BenchmarkExportPromptIDs(b *testing.B) {
	packed := benchrun.Run{Rollouts: 2_000, Steps: 15, Group: 8, PromptIDs: true}
	loose := packed
	loose.Loose = true
	var dirs [2]string
	parent := b
	for _, tc := range []struct {
		name string
		run  benchrun.Run
		opts export.Options
	}{
		{"packed/steps", packed, export.Options{}},
		{"packed/prefix", packed, export.Options{PromptPrefix: true}},
		{"packed/contiguous", packed, export.Options{Contiguous: true}},
		{"loose/steps", loose, export.Options{}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			i := map[bool]int{false: 0, true: 1}[tc.run.Loose]
			if dirs[i] == "" {
				dirs[i] = generate(b, parent, tc.run, "")
			}
			benchExport(b, tc.run, dirs[i], tc.opts)
		})
	}
}

// generate writes run into a new directory, removed when owner ends, or
// into the one keepEnv names (kept between benchmark runs, generated when
// missing).
func generate(b, owner *testing.B, run benchrun.Run, keepEnv string) string {
	dir := ""
	if keepEnv != "" {
		dir = os.Getenv(keepEnv)
	}
	if dir == "" {
		// Not b.TempDir: the run may outlive the sub-benchmark that
		// generated it.
		tmp, err := os.MkdirTemp("", "legato-export-bench-")
		if err != nil {
			b.Fatal(err)
		}
		owner.Cleanup(func() { os.RemoveAll(tmp) })
		dir = filepath.Join(tmp, "run")
	}
	t0, cpu0 := time.Now(), benchrun.CPUTime()
	wrote, err := benchrun.Generate(dir, run)
	if err != nil {
		b.Fatal(err)
	}
	if wrote {
		b.Logf("generated %d rollouts × %d steps in %v (%v of CPU)", run.Rollouts, run.Steps,
			time.Since(t0).Round(time.Millisecond), (benchrun.CPUTime() - cpu0).Round(time.Millisecond))
	}
	return dir
}

// benchExport exports the run in dir with opts and reports MB written per
// second of CPU, the peak heap, x-copy (the export's time over that of
// reading the file it wrote and writing a copy, synced: the bound the
// disk sets), and the run's size on disk per rollout.
func benchExport(b *testing.B, run benchrun.Run, dir string, opts export.Options) {
	runtime.GC()
	out := filepath.Join(b.TempDir(), "train.jsonl")
	b.ResetTimer()
	var peak uint64
	var st export.Stats
	cpu0, t0 := benchrun.CPUTime(), time.Now()
	for range b.N {
		stop, done := make(chan struct{}), make(chan uint64)
		go func() { done <- peakHeap(stop) }()
		var err error
		st, err = export.ExportSteps(dir, out, opts)
		close(stop)
		peak = max(peak, <-done)
		if err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(t0)
	cpu := benchrun.CPUTime() - cpu0
	if cpu > 0 {
		b.ReportMetric(float64(st.Bytes)*float64(b.N)/1e6/cpu.Seconds(), "MB/cpu-s")
		b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s")
	}
	b.StopTimer()
	b.SetBytes(st.Bytes)
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
	b.ReportMetric(float64(st.Lines), "lines")
	want := run.Rollouts * run.Steps
	if opts.Contiguous {
		want = run.Rollouts
	}
	if st.Lines != want {
		b.Fatalf("wrote %d lines, want %d", st.Lines, want)
	}
	c, err := benchrun.CopyTime(out)
	if err != nil {
		b.Fatal(err)
	}
	if c > 0 {
		b.ReportMetric(elapsed.Seconds()/float64(b.N)/c.Seconds(), "x-copy")
	}
	// After the loop: ResetTimer drops reported metrics.
	for _, part := range []struct{ sub, unit string }{{"", "run"}, {schema.TokensDir, "tokens"}} {
		apparent, disk, err := benchrun.DiskUsage(filepath.Join(dir, part.sub))
		if err != nil {
			b.Fatal(err)
		}
		if disk > 0 {
			b.ReportMetric(float64(apparent)/1e3/float64(run.Rollouts), part.unit+"-KB/rollout")
			b.ReportMetric(float64(disk)/1e3/float64(run.Rollouts), part.unit+"-disk-KB/rollout")
		}
	}
}

// BenchmarkSummaryBuilder feeds the records of 10,000 rollouts × 15 steps
// on 16 desktops to a SummaryBuilder, taking a summary after every 8
// records as collect refreshes summary.json when a group closes. One op is
// the whole batch.
func BenchmarkSummaryBuilder(b *testing.B) {
	const rollouts, steps, desktops = 10_000, 15, 16
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	recs := make([]schema.Record, rollouts)
	free := make([]time.Time, desktops)
	for i := range free {
		free[i] = start
	}
	for i := range recs {
		d := i % desktops
		at := free[d]
		rec := schema.Record{
			RolloutID: fmt.Sprintf("r-%05d", i), TaskID: fmt.Sprintf("t-%04d", i/8), GroupID: fmt.Sprintf("v1/t-%04d", i/8),
			Status: schema.StatusOK, Reward: new(float64), Desktop: d, StartedAt: schema.Time{Time: at},
			Timing: schema.Timing{ResetS: 20, WaitAfterResetS: 5, ObsS: 0.5},
		}
		*rec.Reward = float64(i % 2)
		cur := at.Add(25500 * time.Millisecond)
		for k := range steps {
			model := time.Duration(1000+(i*37+k*101)%3000) * time.Millisecond
			rec.Steps = append(rec.Steps, schema.Step{
				StartedAt: schema.Time{Time: cur},
				Model:     schema.ModelCall{Seconds: model.Seconds(), Attempts: 1, PromptTokens: 3000, CachedTokens: new(2000)},
				Response:  schema.Response{TokenIDs: []int64{1}, Logprobs: []float64{-1}},
				Actions:   []schema.ActionRecord{{ActS: 0.2, WaitS: 1.5, ObsS: 0.3}},
			})
			rec.Timing.ModelS += model.Seconds()
			rec.Timing.ActS += 0.2
			rec.Timing.WaitS += 1.5
			rec.Timing.ObsS += 0.3
			cur = cur.Add(model + 2*time.Second)
		}
		rec.Timing.WaitBeforeEvalS, rec.Timing.EvalS = 2, 3
		cur = cur.Add(5 * time.Second)
		rec.Timing.TotalS = cur.Sub(at).Seconds()
		rec.EndedAt = schema.Time{Time: cur}
		free[d] = cur
		recs[i] = rec
	}
	b.ResetTimer()
	for range b.N {
		sb := export.NewSummaryBuilder(schema.Policy{}, 0, 0)
		for i := range recs {
			sb.Add(&recs[i])
			if i%8 == 7 {
				sb.Summary()
			}
		}
		if s := sb.Summary(); s.ModelCalls != rollouts*steps {
			b.Fatalf("ModelCalls = %d", s.ModelCalls)
		}
	}
}
