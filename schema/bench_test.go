package schema

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
)

const (
	screenW, screenH = 1920, 1080
	imageMax         = 20
)

// BenchmarkPutStep measures the content-store cost of one step late in a
// rollout: the prompt of step 15 (system, instruction, 14 earlier
// screenshots and replies, all stored) with a new 1920×1080 screenshot and
// a new reply, as a worker calls PutMessages before each model call.
func BenchmarkPutStep(b *testing.B) {
	const history = 14
	bases := make([][]byte, 4)
	for i := range bases {
		bases[i] = screenshot(screenW, screenH, uint64(i))
	}
	var shots, replies []string
	for j := range history {
		shots = append(shots, dataURL(withTextChunk(bases[j%len(bases)], fmt.Sprint("history ", j))))
		replies = append(replies, reply(j))
	}
	b.Run("new-screenshot", func(b *testing.B) {
		r := mustCreate(b, b.TempDir())
		if _, err := r.PutMessages(prompt(shots, replies, history-1, imageMax)); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			s := append(shots[:history:history], dataURL(withTextChunk(bases[i%len(bases)], fmt.Sprint("step ", i))))
			rs := append(replies[:history-1:history-1], reply(1000+i))
			msgs := prompt(s, rs, history, imageMax)
			b.StartTimer()
			if _, err := r.PutMessages(msgs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(bases[0])), "png-bytes")
	})
	b.Run("history-only", func(b *testing.B) {
		r := mustCreate(b, b.TempDir())
		msgs := prompt(shots, replies, history-1, imageMax)
		if _, err := r.PutMessages(msgs); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := r.PutMessages(msgs); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRolloutStorage stores one 15-step rollout whose prompts keep up
// to 20 screenshots and reports its bytes on disk in the content store
// against writing every step's whole prompt with inline base64 images.
func BenchmarkRolloutStorage(b *testing.B) {
	const steps = 15
	var shots, replies []string
	for k := range steps {
		shots = append(shots, dataURL(screenshot(screenW, screenH, uint64(100+k))))
		replies = append(replies, reply(k))
	}
	var inline int64
	for k := range steps {
		p, err := json.Marshal(prompt(shots, replies, k, imageMax))
		if err != nil {
			b.Fatal(err)
		}
		inline += int64(len(p))
	}
	var store int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := b.TempDir()
		r, err := Create(dir)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for k := range steps {
			if _, err := r.PutMessages(prompt(shots, replies, k, imageMax)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
		store = storeBytes(b, dir)
		b.StartTimer()
	}
	if store >= inline {
		b.Errorf("content store %d bytes, inline prompts %d bytes: want the store smaller", store, inline)
	}
	b.ReportMetric(float64(store), "store-bytes")
	b.ReportMetric(float64(inline), "inline-bytes")
	b.ReportMetric(float64(inline)/float64(store), "inline/store")
}

// BenchmarkLoadRequest measures rebuilding the prompt of step 15 with
// inline images from a warm MessageStore, as export does for each step.
func BenchmarkLoadRequest(b *testing.B) {
	const history = 14
	base := screenshot(screenW, screenH, 1)
	var shots, replies []string
	for j := range history + 1 {
		shots = append(shots, dataURL(withTextChunk(base, fmt.Sprint(j))))
		replies = append(replies, reply(j))
	}
	dir := b.TempDir()
	r := mustCreate(b, dir)
	hashes, err := r.PutMessages(prompt(shots, replies, history, imageMax))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts LoadOptions
	}{{"inline", LoadOptions{}}, {"refs", LoadOptions{KeepImageRefs: true}}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := OpenMessageStore(dir, StoreOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for b.Loop() {
				if _, err := s.Messages(hashes, tc.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendParallel measures records/s with 16 goroutines appending
// at once, as a batch's workers do when their attempts end. "record"
// appends only; "step+record" first stores one new screenshot and message,
// and "rollout+record" those of 15 steps, so the record's content is not yet
// durable when Append starts. Screenshots are tiny: the benchmark measures
// syncs, not hashing.
func BenchmarkAppendParallel(b *testing.B) {
	const goroutines = 16
	for _, bc := range []struct {
		name  string
		steps int
	}{{"record", 0}, {"step+record", 1}, {"rollout+record", 15}} {
		b.Run(bc.name, func(b *testing.B) {
			r := mustCreate(b, b.TempDir())
			var next atomic.Int64
			// RunParallel starts parallelism × GOMAXPROCS goroutines.
			b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprint("bench-", next.Add(1))
					rec := fullRecord(id)
					for k := range bc.steps {
						step := fmt.Sprint(id, " step ", k)
						hashes, err := r.PutMessages([]Message{{Role: "user", Content: []Part{
							TextPart(step), ImagePart(dataURL(withTextChunk(tinyPNG, step))),
						}}})
						if err != nil {
							b.Error(err)
							return
						}
						rec.Steps[0].Request = append(rec.Steps[0].Request, hashes...)
					}
					if err := r.Append(rec); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkAppendTokenIDs compares AppendTokenIDs with the strconv.AppendInt
// loop it replaced, on a prompt's worth of ids of a 150k vocabulary.
func BenchmarkAppendTokenIDs(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]int64, 6500)
	for i := range ids {
		ids[i] = rng.Int64N(151_000)
	}
	var buf []byte
	b.Run("digit-pairs", func(b *testing.B) {
		for b.Loop() {
			buf = AppendTokenIDs(buf[:0], ids)
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("strconv", func(b *testing.B) {
		for b.Loop() {
			buf = append(buf[:0], '[')
			for i, id := range ids {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = strconv.AppendInt(buf, id, 10)
			}
			buf = append(buf, ']')
		}
		b.SetBytes(int64(len(buf)))
	})
}
