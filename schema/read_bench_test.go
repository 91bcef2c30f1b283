package schema_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"legato/rl/internal/benchrun"
	"legato/rl/schema"
)

// BenchmarkReadRecords reads the rollouts.jsonl of a synthetic run of 2,000
// rollouts × 15 steps, parsing on one CPU and on every CPU: the ratio of
// the two is what parsing in parallel gives export's first pass; and on one
// CPU as export reads them (with their logprobs' text, and without the
// requests for a contiguous export).
func BenchmarkReadRecords(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "run")
	if err := (benchrun.Run{Rollouts: 2000, Steps: 15, Group: 8}).Write(dir); err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, schema.RecordsFile)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	read := map[string]func(f *os.File) (schema.ReadStats, error){
		"records": func(f *os.File) (schema.ReadStats, error) {
			return schema.ReadRecords(f, func(schema.Record) error { return nil })
		},
		"text": func(f *os.File) (schema.ReadStats, error) {
			return schema.ReadRecordsText(f, func(schema.Record, *schema.RecordText, int) error { return nil })
		},
		"text-no-requests": func(f *os.File) (schema.ReadStats, error) {
			return schema.ReadRecordsTextWith(f, schema.ReadOptions{NoRequests: true}, func(schema.Record, *schema.RecordText, int) error { return nil })
		},
	}
	for _, tt := range []struct {
		read  string
		procs int
	}{{"records", 1}, {"records", runtime.GOMAXPROCS(0)}, {"text", 1}, {"text-no-requests", 1}} {
		b.Run(fmt.Sprintf("%s/procs=%d", tt.read, tt.procs), func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tt.procs))
			b.SetBytes(fi.Size())
			for b.Loop() {
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				st, err := read[tt.read](f)
				f.Close()
				if err != nil || st.Records != 2000 {
					b.Fatalf("%d records, %v", st.Records, err)
				}
			}
		})
	}
}
