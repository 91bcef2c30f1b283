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
// the two is what parsing in parallel gives export's first pass.
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
	for _, procs := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			b.SetBytes(fi.Size())
			for b.Loop() {
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				st, err := schema.ReadRecords(f, func(schema.Record) error { return nil })
				f.Close()
				if err != nil || st.Records != 2000 {
					b.Fatalf("%d records, %v", st.Records, err)
				}
			}
		})
	}
}
