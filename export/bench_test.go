package export_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"legato/rl/export"
	"legato/rl/schema"
)

// syntheticRun describes a large run for the benchmark.
type syntheticRun struct {
	rollouts, steps, group int
	// promptIDs stores each step's prompt token ids (2,000 + 300 per
	// step), chunked as a schema.TokenWriter stores them.
	promptIDs bool
	// loose stores each message and token chunk as a file of its own, as
	// runs did before packs.
	loose bool
}

// benchPack appends objects to a pack file as schema documents the
// layout: a magic, then per object its content's sha256, the length of
// its data and the data.
type benchPack struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func newBenchPack(dir string) (*benchPack, error) {
	f, err := os.Create(filepath.Join(dir, "pack-1"))
	if err != nil {
		return nil, err
	}
	p := &benchPack{f: f, w: bufio.NewWriterSize(f, 1<<20)}
	_, err = p.w.WriteString("LGPACK1\n")
	return p, err
}

func (p *benchPack) put(sum [32]byte, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w.Write(sum[:])
	p.w.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(data))))
	_, err := p.w.Write(data)
	return err
}

func (p *benchPack) close() error {
	err := p.w.Flush()
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// store writes one object of the kind in dir: into its pack, or as a file
// named by its hash.
func (s syntheticRun) store(pack *benchPack, dir string, sum [32]byte, data []byte) error {
	if s.loose {
		return os.WriteFile(filepath.Join(dir, hex.EncodeToString(sum[:])), data, 0o644)
	}
	return pack.put(sum, data)
}

// write writes the run into dir the way the content store lays it out,
// without a Run: a Run syncs every object and record, which would make
// generating 300,000 messages take minutes. Like a real run, each step's
// prompt repeats the rollout's history (system prompt, instruction, every
// earlier reply and screenshot), so messages are shared across steps and
// each rollout adds two new ones per step. Images are references only; the
// benchmark exports references and never reads them.
func (s syntheticRun) write(dir string) error {
	for _, d := range []string{schema.MessagesDir, schema.ImagesDir, schema.TokensDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return err
	}
	defer enc.Close()
	msgDir, tokDir := filepath.Join(dir, schema.MessagesDir), filepath.Join(dir, schema.TokensDir)
	var msgPack, tokPack *benchPack
	if !s.loose {
		if msgPack, err = newBenchPack(msgDir); err != nil {
			return err
		}
		if tokPack, err = newBenchPack(tokDir); err != nil {
			return err
		}
	}
	put := func(m schema.Message) (string, error) {
		canon, err := json.Marshal(m)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(canon)
		return hex.EncodeToString(sum[:]), s.store(msgPack, msgDir, sum, enc.EncodeAll(canon, nil))
	}
	// putIDs stores a rollout's next prompt as schema.Run's TokenWriter
	// does: cut by the rollout's chunker, each new chunk zstd-compressed
	// under its hash. A chunk already written (a sibling's) is not
	// written again.
	var stored sync.Map
	putIDs := func(c *schema.PromptChunker, ids []int64) ([]string, error) {
		var hashes []string
		for _, ch := range c.Cut(ids) {
			hashes = append(hashes, ch.Hash)
			if ch.Content == nil {
				continue
			}
			if _, dup := stored.LoadOrStore(ch.Hash, struct{}{}); dup {
				continue
			}
			sum, _ := hex.DecodeString(ch.Hash)
			if err := s.store(tokPack, tokDir, [32]byte(sum), enc.EncodeAll(ch.Content, nil)); err != nil {
				return nil, err
			}
		}
		return hashes, nil
	}
	// A system prompt the size of a computer_use tool schema.
	system, err := put(schema.Message{Role: "system", Content: []schema.Part{
		schema.TextPart(strings.Repeat("You control a desktop through the computer_use tool; describe each action. ", 40)),
	}})
	if err != nil {
		return err
	}

	f, err := os.Create(filepath.Join(dir, schema.RecordsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	// Rollouts are built by two workers (the machine has two cores) and
	// written in order.
	recs := make([][]byte, s.rollouts)
	var g errgroup.Group
	g.SetLimit(2)
	instructions := make([]string, (s.rollouts+s.group-1)/s.group)
	var instrMu sync.Mutex
	for i := range s.rollouts {
		g.Go(func() error {
			task := i / s.group
			instrMu.Lock()
			instr := instructions[task]
			if instr == "" {
				if instr, err = put(schema.Message{Role: "user", Content: []schema.Part{
					schema.TextPart(fmt.Sprintf("Task %d: open the report in the spreadsheet and sum column B, then save it as a PDF.", task)),
				}}); err != nil {
					instrMu.Unlock()
					return err
				}
				instructions[task] = instr
			}
			instrMu.Unlock()
			rec := schema.Record{
				Schema: schema.Version, RolloutID: fmt.Sprintf("r-%05d", i), TaskID: fmt.Sprintf("task-%04d", task),
				Domain: "libreoffice_calc", GroupID: fmt.Sprintf("v1/task-%04d", task), Attempt: i % s.group,
				Policy: schema.Policy{Model: "qwen3-vl-8b", Version: "v1"}, Status: schema.StatusOK,
				Reward: new(float64), NSteps: s.steps, Desktop: i % 16,
				StartedAt: schema.Time{Time: start.Add(time.Duration(i) * time.Second)},
				EndedAt:   schema.Time{Time: start.Add(time.Duration(i)*time.Second + 90*time.Second)},
			}
			*rec.Reward = float64(i % 3 % 2)
			history := []string{system, instr}
			var chunker schema.PromptChunker
			// The prompt's ids: 2,000 to start, then each step's reply
			// (80 ids) and 220 more, so that it grows by 300 a step and
			// holds every earlier reply as contiguous history does.
			var prompt []int64
			grow := func(n int) {
				for range n {
					prompt = append(prompt, int64(100+(i*31+len(prompt)*17)%150000))
				}
			}
			grow(2000)
			for k := range s.steps {
				shot, err := put(schema.Message{Role: "user", Content: []schema.Part{
					schema.ImagePart(fmt.Sprintf("%s%064x", schema.ImageScheme, i*1000+k)),
				}})
				if err != nil {
					return err
				}
				history = append(history, shot)
				content := fmt.Sprintf("I will click cell B%d to select it.\n<tool_call>{\"name\": \"computer_use\", \"arguments\": {\"action\": \"left_click\", \"coordinate\": [%d, %d]}}</tool_call>", k+2, 100+k, 200+i%500)
				ids := make([]int64, 80)
				lps := make([]float64, 80)
				for j := range ids {
					ids[j] = int64(1000 + (i*7+j*13)%150000)
					lps[j] = -float64((i+j)%97) / 64
				}
				var chunks []string
				var count int
				if s.promptIDs {
					if chunks, err = putIDs(&chunker, prompt); err != nil {
						return err
					}
					count = len(prompt)
				}
				prompt = append(prompt, ids...)
				grow(220)
				rec.Steps = append(rec.Steps, schema.Step{
					Request:           append([]string(nil), history...),
					PromptTokenChunks: chunks,
					PromptTokenCount:  count,
					StartedAt:         rec.StartedAt,
					Response: schema.Response{Content: content, Reasoning: "The spreadsheet is open; column B holds the values.",
						TokenIDs: ids, Logprobs: lps, FinishReason: "stop", TokenIDsSource: schema.SourceReturnTokenIDs},
					Model:   schema.ModelCall{Seconds: 1.5, Attempts: 1, PromptTokens: 2000 + 1200*k, CompletionTokens: 80, CachedTokens: new(1200 * k)},
					Actions: []schema.ActionRecord{{Action: fmt.Sprintf("import pyautogui; pyautogui.click(%d, %d)", 100+k, 200), ActS: 0.2, WaitS: 1, ObsS: 0.3}},
				})
				reply, err := put(schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(content)}})
				if err != nil {
					return err
				}
				history = append(history, reply)
			}
			line, err := json.Marshal(&rec)
			recs[i] = append(line, '\n')
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if !s.loose {
		if err := msgPack.close(); err != nil {
			return err
		}
		if err := tokPack.close(); err != nil {
			return err
		}
	}
	for _, line := range recs {
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

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
	run := syntheticRun{rollouts: 10_000, steps: 15, group: 8}
	benchExport(b, run, generate(b, b, run, "LEGATO_EXPORT_BENCH_RUN"), export.Options{})
}

// BenchmarkExportPromptIDs exports 2,000 rollouts × 15 steps whose samples
// carry their prompts' token ids (2,000 + 300 a step), in each export
// shape: per-step samples with whole prompts (about a gigabyte of JSONL,
// most of it ids), with prompt prefixes, and contiguous sequences; and
// per-step samples from a run whose objects are loose files. Run it with
// -benchtime=1x.
func BenchmarkExportPromptIDs(b *testing.B) {
	packed := syntheticRun{rollouts: 2_000, steps: 15, group: 8, promptIDs: true}
	loose := packed
	loose.loose = true
	var dirs [2]string
	parent := b
	for _, tc := range []struct {
		name string
		run  syntheticRun
		opts export.Options
	}{
		{"packed/steps", packed, export.Options{}},
		{"packed/prefix", packed, export.Options{PromptPrefix: true}},
		{"packed/contiguous", packed, export.Options{Contiguous: true}},
		{"loose/steps", loose, export.Options{}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			i := map[bool]int{false: 0, true: 1}[tc.run.loose]
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
func generate(b, owner *testing.B, run syntheticRun, keepEnv string) string {
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
	complete := filepath.Join(dir, ".complete")
	if _, err := os.Stat(complete); err != nil {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			b.Fatalf("%s holds files but no complete generated run: remove it or name an empty directory", dir)
		}
		t0, cpu0 := time.Now(), cpuTime()
		if err := run.write(dir); err != nil {
			b.Fatal(err)
		}
		b.Logf("generated %d rollouts × %d steps in %v (%v of CPU)", run.rollouts, run.steps,
			time.Since(t0).Round(time.Millisecond), (cpuTime() - cpu0).Round(time.Millisecond))
		if err := os.WriteFile(complete, nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// benchExport exports the run in dir with opts and reports MB written per
// second of CPU, the peak heap, x-copy (the export's time over that of
// reading the file it wrote and writing a copy, synced: the bound the
// disk sets), and the run's size on disk per rollout.
func benchExport(b *testing.B, run syntheticRun, dir string, opts export.Options) {
	runtime.GC()
	out := filepath.Join(b.TempDir(), "train.jsonl")
	b.ResetTimer()
	var peak uint64
	var st export.Stats
	cpu0, t0 := cpuTime(), time.Now()
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
	cpu := cpuTime() - cpu0
	if cpu > 0 {
		b.ReportMetric(float64(st.Bytes)*float64(b.N)/1e6/cpu.Seconds(), "MB/cpu-s")
		b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s")
	}
	b.StopTimer()
	b.SetBytes(st.Bytes)
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
	b.ReportMetric(float64(st.Lines), "lines")
	want := run.rollouts * run.steps
	if opts.Contiguous {
		want = run.rollouts
	}
	if st.Lines != want {
		b.Fatalf("wrote %d lines, want %d", st.Lines, want)
	}
	if c := copyTime(b, out); c > 0 {
		b.ReportMetric(elapsed.Seconds()/float64(b.N)/c.Seconds(), "x-copy")
	}
	// After the loop: ResetTimer drops reported metrics.
	for _, part := range []struct{ sub, unit string }{{"", "run"}, {schema.TokensDir, "tokens"}} {
		apparent, disk, err := diskUsage(filepath.Join(dir, part.sub))
		if err != nil {
			b.Fatal(err)
		}
		if disk > 0 {
			b.ReportMetric(float64(apparent)/1e3/float64(run.rollouts), part.unit+"-KB/rollout")
			b.ReportMetric(float64(disk)/1e3/float64(run.rollouts), part.unit+"-disk-KB/rollout")
		}
	}
}

// copyTime reads path and writes a synced copy of it beside it, and
// returns how long that took.
func copyTime(b *testing.B, path string) time.Duration {
	t0 := time.Now()
	src, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(path + ".copy")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(dst.Name())
	if _, err := io.Copy(struct{ io.Writer }{dst}, src); err != nil { // no copy_file_range: the bytes pass through memory
		b.Fatal(err)
	}
	if err := dst.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
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
