package grade

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseEvaluator feeds task evaluators (untrusted input) to the parser:
// it must not panic, and what it accepts must be something Grade can run.
func FuzzParseEvaluator(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "tasks", "*.json"))
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var task struct{ Evaluator json.RawMessage }
		if err := json.Unmarshal(data, &task); err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(task.Evaluator))
	}
	f.Add([]byte(`{"func":["a","b"],"conj":"or","result":[{"type":"x"},{"type":"y"}],"expected":[null,{"type":"rule"}],"options":[null,{"k":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := ParseEvaluator(data)
		if err != nil {
			return
		}
		if ev.Conj != And && ev.Conj != Or {
			t.Fatalf("conj %q accepted", ev.Conj)
		}
		if ev.Infeasible {
			return
		}
		if len(ev.Metrics) == 0 || (!ev.List && len(ev.Metrics) != 1) {
			t.Fatalf("%d metrics accepted (list %v)", len(ev.Metrics), ev.List)
		}
		for _, m := range ev.Metrics {
			if m.Func == "" || m.Result.Type == "" || (m.Expected != nil && m.Expected.Type == "") {
				t.Fatalf("incomplete metric accepted: %+v", m)
			}
			if _, err := getterConfig(m.Result); err != nil {
				t.Fatalf("result config: %v", err)
			}
			o, err := decodePy(m.Options)
			if err != nil {
				t.Fatalf("options: %v", err)
			}
			if _, ok := o.(*pyDict); !ok {
				t.Fatalf("options %s are not an object", m.Options)
			}
		}
	})
}

// FuzzShlexSplit checks that splitting never panics and that a split
// command line joined back with quoting splits the same.
func FuzzShlexSplit(f *testing.F) {
	for _, s := range []string{`a "b c" 'd'`, `x\ y`, `"\""`, `''`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := shlexSplit(s)
		if err != nil {
			return
		}
		var line string
		for _, w := range words {
			line += "'" + strings.ReplaceAll(w, "'", `'"'"'`) + "' "
		}
		again, err := shlexSplit(line)
		if err != nil || len(again) != len(words) {
			t.Fatalf("re-split of %q: %q, %v; want %q", line, again, err, words)
		}
		for i := range words {
			if again[i] != words[i] {
				t.Fatalf("re-split of %q: %q, want %q", line, again, words)
			}
		}
	})
}
