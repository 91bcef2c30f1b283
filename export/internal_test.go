package export

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image"
	pngpkg "image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/internal/benchrun"
	"legato/rl/schema"
)

func rec(id, group string, status schema.Status, reward *float64) *schema.Record {
	return &schema.Record{RolloutID: id, GroupID: group, Status: status, Reward: reward}
}

func r(v float64) *float64 { return &v }

// TestGroupTable checks which records enter a group's statistics and the
// advantages they get, against hand-computed values.
func TestGroupTable(t *testing.T) {
	records := []*schema.Record{
		// g1: finished rewards 1, 0, 0 → mean 1/3, population std √2/3.
		rec("g1-ok1", "g1", schema.StatusOK, r(1)),
		rec("g1-retried", "g1", schema.StatusRetried, nil),
		rec("g1-trunc0", "g1", schema.StatusTruncated, r(0)),
		rec("g1-surplus", "g1", schema.StatusSurplus, r(1)),
		rec("g1-cancelled", "g1", schema.StatusCancelled, nil),
		rec("g1-error", "g1", schema.StatusError, nil),
		rec("g1-skipped", "g1", schema.StatusSkipped, nil),
		rec("g1-ok0", "g1", schema.StatusOK, r(0)),
		// g2: a single finished attempt among errors and surplus → 0.
		rec("g2-error", "g2", schema.StatusError, nil),
		rec("g2-ok", "g2", schema.StatusOK, r(1)),
		rec("g2-surplus", "g2", schema.StatusSurplus, r(0)),
		// g3: all equal → 0.
		rec("g3-a", "g3", schema.StatusOK, r(1)),
		rec("g3-b", "g3", schema.StatusTruncated, r(1)),
		// g4: only surplus; a finished record without reward is not taken.
		rec("g4-surplus", "g4", schema.StatusSurplus, r(1)),
		rec("g4-noreward", "g4", schema.StatusOK, nil),
	}
	tab := newGroupTable()
	var taken []string
	for _, rc := range records {
		if tab.add(rc) {
			taken = append(taken, rc.RolloutID)
		}
	}
	tab.finish(schema.PopulationStd)
	if diff := cmp.Diff([]string{"g1-ok1", "g1-trunc0", "g1-ok0", "g2-ok", "g3-a", "g3-b"}, taken); diff != "" {
		t.Errorf("records in the statistics (-want +got):\n%s", diff)
	}

	type adv struct {
		Adv float64
		OK  bool
	}
	want := map[string]adv{
		"g1-ok1": {math.Sqrt2, true}, "g1-trunc0": {-1 / math.Sqrt2, true}, "g1-ok0": {-1 / math.Sqrt2, true},
		"g2-ok": {0, true}, "g3-a": {0, true}, "g3-b": {0, true},
	}
	got := map[string]adv{}
	for _, rc := range records {
		if a, ok := tab.advantage(rc.GroupID, rc.RolloutID); ok {
			got[rc.RolloutID] = adv{a, ok}
		}
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("advantages (-want +got):\n%s", diff)
	}
	gotConst := map[string]bool{}
	for _, g := range []string{"g1", "g2", "g3", "g4"} {
		gotConst[g] = tab.constant(g)
	}
	if diff := cmp.Diff(map[string]bool{"g1": false, "g2": true, "g3": true, "g4": true}, gotConst); diff != "" {
		t.Errorf("constant groups (-want +got):\n%s", diff)
	}
}

func TestIntervalSet(t *testing.T) {
	tests := []struct {
		name       string
		a, b       []interval
		wantUnion  []interval
		wantMinus  int64
		compactMid bool
	}{
		{name: "empty"},
		{name: "disjoint", a: []interval{{5, 7}, {0, 2}}, b: []interval{{3, 4}},
			wantUnion: []interval{{0, 2}, {5, 7}}, wantMinus: 4},
		{name: "overlapping and touching merge", a: []interval{{0, 2}, {1, 4}, {4, 5}, {8, 9}},
			b: []interval{{1, 3}}, wantUnion: []interval{{0, 5}, {8, 9}}, wantMinus: 4},
		{name: "b covers a", a: []interval{{2, 3}}, b: []interval{{0, 10}},
			wantUnion: []interval{{2, 3}}, wantMinus: 0},
		{name: "b cuts holes", a: []interval{{0, 10}}, b: []interval{{1, 2}, {4, 6}, {9, 12}},
			wantUnion: []interval{{0, 10}}, wantMinus: 6},
		{name: "b spans two of a", a: []interval{{0, 3}, {5, 8}}, b: []interval{{2, 6}},
			wantUnion: []interval{{0, 3}, {5, 8}}, wantMinus: 4},
		{name: "empty intervals ignored", a: []interval{{3, 3}, {4, 2}},
			wantUnion: nil, wantMinus: 0},
		{name: "added after a compaction", a: []interval{{6, 8}, {0, 1}, {7, 9}}, compactMid: true,
			wantUnion: []interval{{0, 1}, {6, 9}}, wantMinus: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a, b intervalSet
			for i, iv := range tt.a {
				a.add(iv.start, iv.end)
				if tt.compactMid && i == 0 {
					a.compact()
				}
			}
			for _, iv := range tt.b {
				b.add(iv.start, iv.end)
			}
			if got := a.minus(&b); got != tt.wantMinus {
				t.Errorf("minus = %d, want %d", got, tt.wantMinus)
			}
			if diff := cmp.Diff(tt.wantUnion, a.union, cmp.AllowUnexported(interval{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("union (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"none", nil, 0.5, 0},
		{"one", []float64{3}, 0.99, 3},
		{"median of even", []float64{1, 2, 3, 4}, 0.5, 2.5},
		{"p95 interpolates", []float64{0, 10}, 0.95, 9.5},
		{"p99 of 1..101", seq(1, 101), 0.99, 100},
		{"max", []float64{1, 5}, 1, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func seq(lo, hi int) []float64 {
	var out []float64
	for i := lo; i <= hi; i++ {
		out = append(out, float64(i))
	}
	return out
}

// TestSortedFloats checks that values added between sorts come out
// merged in order.
func TestSortedFloats(t *testing.T) {
	var f sortedFloats
	for _, v := range []float64{5, 1, 3} {
		f.add(v)
	}
	if diff := cmp.Diff([]float64{1, 3, 5}, f.sorted()); diff != "" {
		t.Errorf("first sort (-want +got):\n%s", diff)
	}
	for _, v := range []float64{4, 0, 6, 3} {
		f.add(v)
	}
	if diff := cmp.Diff([]float64{0, 1, 3, 3, 4, 5, 6}, f.sorted()); diff != "" {
		t.Errorf("after more (-want +got):\n%s", diff)
	}
}

// TestServerIdle checks the idle time per phase on two hand-laid attempts
// (seconds from t):
//
//	desktop 0: reset [0,2]  model [2,5]  act [5,6]  eval [6,7]
//	desktop 1: reset [1,4]  queue [4,5]  model [5,6]  wait [6,8]
//
// The server is busy during [2,6].
func TestServerIdle(t *testing.T) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ts := func(s float64) schema.Time { return schema.Time{Time: at.Add(time.Duration(s * 1e9))} }
	d0 := &schema.Record{
		RolloutID: "d0", GroupID: "g", Status: schema.StatusOK, Reward: r(1), Desktop: 0,
		Timing: schema.Timing{ResetS: 2, ModelS: 3, ActS: 1, EvalS: 1, TotalS: 7},
		Steps: []schema.Step{{StartedAt: ts(2), Model: schema.ModelCall{Seconds: 3},
			Actions: []schema.ActionRecord{{ActS: 1}}}},
		StartedAt: ts(0), EndedAt: ts(7),
	}
	d1 := &schema.Record{
		RolloutID: "d1", GroupID: "g", Status: schema.StatusCancelled, Desktop: 1,
		Timing: schema.Timing{ResetS: 3, QueueS: 1, ModelS: 1, WaitS: 2, TotalS: 7},
		Steps: []schema.Step{{StartedAt: ts(5), Model: schema.ModelCall{Seconds: 1, QueueS: 1},
			Actions: []schema.ActionRecord{{WaitS: 2}}}},
		StartedAt: ts(1), EndedAt: ts(8),
	}
	b := NewSummaryBuilder(schema.Policy{}, 0, 0)
	b.Add(d0)
	b.Add(d1)
	got := b.Summary().ServerIdleS
	want := map[string]float64{
		PhaseReset: 2, PhaseWaitAfterReset: 0, PhaseQueue: 0, PhaseAct: 0, PhaseWait: 2, PhaseObs: 0,
		PhaseWaitBeforeEval: 0, PhaseEval: 1, IdleTotal: 4,
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("ServerIdleS (-want +got):\n%s", diff)
	}
}

// TestSummaryCacheAndTokenIDs: the hit rate is known only once some answer
// gave a cached count, and then an answer without one counts as 0; the
// token-id source is the one most steps came with.
func TestSummaryCacheAndTokenIDs(t *testing.T) {
	step := func(prompt int, cached *int, src schema.TokenIDSource, promptIDs bool) schema.Step {
		st := schema.Step{Model: schema.ModelCall{PromptTokens: prompt, CachedTokens: cached},
			Response: schema.Response{TokenIDsSource: src}}
		if promptIDs {
			st.PromptTokenChunks = []string{"c"}
		}
		return st
	}
	tests := []struct {
		name         string
		steps        []schema.Step
		wantReported bool
		wantRate     float64
		wantSource   schema.TokenIDSource
		wantExact    float64
		wantPrompt   float64
	}{
		{
			name: "no answer gave a count (reporting off)",
			steps: []schema.Step{
				step(1000, nil, schema.SourceTokensAsIDs, false),
				step(1000, nil, schema.SourceTokensAsIDs, false),
			},
			wantSource: schema.SourceTokensAsIDs, wantExact: 1,
		},
		{
			// vLLM 0.9 to mid-2026: null at 0 cached, a count otherwise.
			name: "null at 0 cached, then a hit",
			steps: []schema.Step{
				step(1000, nil, schema.SourceReturnTokenIDs, true),
				step(1000, new(750), schema.SourceReturnTokenIDs, true),
				step(2000, nil, schema.SourceReturnTokenIDs, true),
				step(4000, new(1000), schema.SourceReturnTokenIDs, true),
			},
			wantReported: true, wantRate: 1750.0 / 8000, wantSource: schema.SourceReturnTokenIDs, wantExact: 1, wantPrompt: 1,
		},
		{
			name: "reported zeros",
			steps: []schema.Step{
				step(1000, new(0), schema.SourceStrings, false),
				step(1000, new(0), schema.SourceStrings, false),
			},
			wantReported: true, wantSource: schema.SourceStrings,
		},
		{
			name: "the exact source wins a tie",
			steps: []schema.Step{
				step(1000, nil, schema.SourceStrings, false),
				step(1000, nil, schema.SourceMetaInfo, true),
			},
			wantSource: schema.SourceMetaInfo, wantExact: 0.5, wantPrompt: 0.5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewSummaryBuilder(schema.Policy{}, 0, 0)
			b.Add(&schema.Record{RolloutID: "r", GroupID: "g", Status: schema.StatusOK, Steps: tt.steps})
			s := b.Summary()
			got := [5]any{s.PrefixCacheReported, s.PrefixCacheHitRate, s.TokenIDSource, s.StepsWithExactTokenIDs, s.StepsWithPromptTokenIDs}
			want := [5]any{tt.wantReported, tt.wantRate, tt.wantSource, tt.wantExact, tt.wantPrompt}
			if got != want {
				t.Errorf("reported, rate, source, exact, prompt ids = %v, want %v", got, want)
			}
			n := 0
			for _, c := range s.TokenIDSources {
				n += c
			}
			if n != len(tt.steps) {
				t.Errorf("TokenIDSources %v count %d steps, want %d", s.TokenIDSources, n, len(tt.steps))
			}
		})
	}
}

// TestExportReadsRecordsTwicePastBound: an export in two passes writes
// what one in one pass does (advantages written over their placeholders
// at the end), whether it keeps the records between its passes or, past
// keepRecordsBytes, reads them again.
func TestExportReadsRecordsTwicePastBound(t *testing.T) {
	opts := Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}
	defer func(b int64) { keepRecordsBytes = b }(keepRecordsBytes)
	defer func() { onePassExport = true }()
	for _, contiguous := range []bool{false, true} {
		run, opts := "testdata/run", opts
		if contiguous {
			run, opts = filepath.Join(t.TempDir(), "gen"), Options{Contiguous: true}
			if _, err := benchrun.Generate(run, benchrun.Run{Rollouts: 24, Steps: 3, Group: 4, PromptIDs: true}); err != nil {
				t.Fatal(err)
			}
		}
		outs := map[string][]byte{}
		for _, way := range []string{"one pass", "two passes", "two passes reading twice"} {
			onePassExport, keepRecordsBytes = way == "one pass", 256<<20
			if way == "two passes reading twice" {
				keepRecordsBytes = 0
			}
			out := filepath.Join(t.TempDir(), "out.jsonl")
			if _, err := ExportSteps(run, out, opts); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			outs[way] = b
		}
		// Some advantages are not 0: written over their placeholders.
		one, nonzero := outs["one pass"], 0
		for line := range bytes.Lines(one) {
			var s struct{ Advantage float64 }
			if err := json.Unmarshal(line, &s); err != nil {
				t.Fatal(err)
			}
			if s.Advantage != 0 {
				nonzero++
			}
		}
		if nonzero == 0 {
			t.Fatalf("%s: one pass wrote %d bytes, every advantage 0", run, len(one))
		}
		for way, b := range outs {
			if !bytes.Equal(b, one) {
				t.Errorf("%s, contiguous %v: export in %s wrote %d bytes, in one pass %d, not the same", run, contiguous, way, len(b), len(one))
			}
		}
	}
}

// TestCommonChunkPrefix: the prefix two chunked prompts share, and the ids
// after it, are those of the prompts joined, wherever the chunks are cut
// and however many leading chunks are known to be shared.
func TestCommonChunkPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cut := func(ids []int64) [][]int64 {
		var out [][]int64
		for len(ids) > 0 {
			k := rng.IntN(min(len(ids), 6) + 1)
			out = append(out, ids[:k])
			ids = ids[k:]
		}
		return out
	}
	flat := func(chunks [][]int64) []int64 {
		out := []int64{}
		for _, c := range chunks {
			out = append(out, c...)
		}
		return out
	}
	for range 2000 {
		shared := make([]int64, rng.IntN(12))
		for i := range shared {
			shared[i] = rng.Int64N(3)
		}
		head := cut(shared) // the chunks both prompts start with
		a := append(slices.Clone(head), cut(randIDs(rng, rng.IntN(10)))...)
		b := append(slices.Clone(head), cut(randIDs(rng, rng.IntN(10)))...)
		skip := rng.IntN(len(head) + 1)
		fa, fb := flat(a), flat(b)
		want := commonPrefix(fa, fb)
		n := commonChunkPrefix(a, b, skip)
		if n != want {
			t.Fatalf("commonChunkPrefix(%v, %v, %d) = %d, want %d", a, b, skip, n, want)
		}
		if got := flat(dropIDs(b, n)); !slices.Equal(got, fb[n:]) {
			t.Fatalf("dropIDs(%v, %d) = %v, want %v", b, n, got, fb[n:])
		}
	}
}

func randIDs(rng *rand.Rand, n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = rng.Int64N(3)
	}
	return ids
}

// TestCopiedLogprobsAsFormatted: an export copying logprobs from the
// records' text writes the bytes it writes formatting them, in every
// shape, with the records kept or read twice, on a generated run (every
// step's text copied), on the same run with one step's logprobs spaced (no
// text: its values are parsed and formatted) and on the fixture run
// (logprobs null, missing and mismatched).
func TestCopiedLogprobsAsFormatted(t *testing.T) {
	run := benchrun.Run{Rollouts: 16, Steps: 3, Group: 4, PromptIDs: true}
	gen := filepath.Join(t.TempDir(), "gen")
	if _, err := benchrun.Generate(gen, run); err != nil {
		t.Fatal(err)
	}
	texts := 0
	if _, err := schema.ReadRunRecordsText(gen, func(rec schema.Record, text *schema.RecordText, _ int) error {
		for i := range rec.Steps {
			if text.Logprobs(&rec, i) != nil {
				texts++
			}
		}
		return nil
	}); err != nil || texts != 16*3 {
		t.Fatalf("%d of %d steps with their logprobs' text: %v", texts, 16*3, err)
	}
	// A run where one step's logprobs hold a space, which its record's
	// text cannot copy: the writers format that step's values and, for a
	// sequence, every step's, which a lazy read must have parsed.
	spaced := filepath.Join(t.TempDir(), "spaced")
	if _, err := benchrun.Generate(spaced, run); err != nil {
		t.Fatal(err)
	}
	records := filepath.Join(spaced, schema.RecordsFile)
	b, err := os.ReadFile(records)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte(`"logprobs":[`))
	comma := bytes.IndexByte(b[at:], ',')
	if at < 0 || comma < 0 {
		t.Fatalf("no logprobs in %s", records)
	}
	b = slices.Insert(b, at+comma+1, ' ')
	if err := os.WriteFile(records, b, 0o644); err != nil {
		t.Fatal(err)
	}
	loose := Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}
	defer func(b int64) { keepRecordsBytes = b }(keepRecordsBytes)
	defer func() { copyLogprobText, onePassExport = true, true }()
	for _, tc := range []struct {
		run  string
		opts Options
	}{
		{gen, Options{}}, {gen, Options{PromptPrefix: true}}, {gen, Options{Contiguous: true}},
		{spaced, Options{}}, {spaced, Options{Contiguous: true}},
		{"testdata/run", loose}, {"testdata/run", Options{PromptPrefix: true, AllowMissingLogprobs: true, AllowBadLogprobs: true}},
	} {
		var keptOut []byte // the output with records kept, for the one reading them twice
		for _, keep := range []int64{256 << 20, 0} {
			// Two passes: one keeps records between them or not.
			keepRecordsBytes, onePassExport = keep, false
			var outs [2][]byte
			for i, copyText := range []bool{true, false} {
				copyLogprobText = copyText
				out := filepath.Join(t.TempDir(), "out.jsonl")
				if _, err := ExportSteps(tc.run, out, tc.opts); err != nil {
					t.Fatalf("%s %+v: %v", tc.run, tc.opts, err)
				}
				var err error
				if outs[i], err = os.ReadFile(out); err != nil {
					t.Fatal(err)
				}
			}
			if len(outs[0]) == 0 || !bytes.Equal(outs[0], outs[1]) {
				t.Errorf("%s %+v, keeping records %v: copying logprobs wrote %d bytes, formatting them %d, not the same",
					tc.run, tc.opts, keep > 0, len(outs[0]), len(outs[1]))
			}
			if keep > 0 {
				keptOut = outs[0]
			} else if !bytes.Equal(keptOut, outs[0]) {
				t.Errorf("%s %+v: reading the records twice wrote %d bytes, keeping them %d, not the same",
					tc.run, tc.opts, len(outs[0]), len(keptOut))
			}
		}
	}
}

// TestMessageJSONAsEncoded: a stored message's JSON with its HTML
// characters unescaped (what an export writes) is what encoding/json, HTML
// characters unescaped, writes for the message as loaded: for text full of
// escapes (HTML characters, quotes, backslashes, one before "u003c" too,
// control characters, U+2028, invalid UTF-8) and images as references.
func TestMessageJSONAsEncoded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	run, err := schema.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	var png bytes.Buffer
	if err := pngpkg.Encode(&png, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	dataURL := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png.Bytes())
	pieces := []string{"<", ">", "&", `"`, `\`, `\u003c`, `\\u003e`, "\u2028", "\u2029", "\x00", "\x1f", "\t", "\n", "\xff",
		"é", "<tool_call>", "a", " ", "u0026", "&amp;", "\u003c", "'"}
	rng := rand.New(rand.NewPCG(5, 6))
	text := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return b.String()
	}
	msgs := []schema.Message{{Role: "user"}, {Role: "<system>", Content: []schema.Part{}}}
	for range 500 {
		m := schema.Message{Role: text()}
		for range rng.IntN(4) {
			switch rng.IntN(4) {
			case 0:
				m.Content = append(m.Content, schema.ImagePart(dataURL))
			case 1:
				m.Content = append(m.Content, schema.ImagePart("https://example.invalid/"+text()))
			default:
				m.Content = append(m.Content, schema.TextPart(text()))
			}
		}
		msgs = append(msgs, m)
	}
	hashes, err := run.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Close(); err != nil {
		t.Fatal(err)
	}
	store, err := schema.OpenMessageStore(dir, schema.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sw := newSampleWriter(nil)
	escaped := 0
	for i, h := range hashes {
		canon, err := store.MessageJSON(h)
		if err != nil {
			t.Fatal(err)
		}
		m, err := store.Message(h)
		if err != nil {
			t.Fatal(err)
		}
		want, err := sw.encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendUnescapedHTML(nil, canon); !bytes.Equal(got, want) {
			t.Fatalf("message %d: stored %s\nunescaped %s\nwant      %s", i, canon, got, want)
		}
		if bytes.Contains(canon, []byte(`\u003c`)) {
			escaped++
		}
	}
	if escaped == 0 {
		t.Error("no stored message has an escaped HTML character: the test tests nothing")
	}
}

// TestOnePassRefusesAsTwo: an export in one pass refuses a run with the
// error two passes give, though it finds some of it only after writing
// samples (broken or missing logprobs, a record lost in the middle, an
// attempt twice) or fails to write a sample first (a step without exact
// ids, which a sequence needs).
func TestOnePassRefusesAsTwo(t *testing.T) {
	defer func() { onePassExport = true }()
	// edit rewrites the record on line i (0-based) of dir's records.
	edit := func(t *testing.T, dir string, i int, change func(rec map[string]any)) {
		t.Helper()
		path := filepath.Join(dir, schema.RecordsFile)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.SplitAfter(data, []byte("\n"))
		var rec map[string]any
		if err := json.Unmarshal(lines[i], &rec); err != nil {
			t.Fatal(err)
		}
		change(rec)
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = append(b, '\n')
		if err := os.WriteFile(path, bytes.Join(lines, nil), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	response := func(rec map[string]any, step int) map[string]any {
		return rec["steps"].([]any)[step].(map[string]any)["response"].(map[string]any)
	}
	notExact := func(rec map[string]any) { response(rec, 0)["token_ids_source"] = "tokenizer" }
	appendLine := func(t *testing.T, dir string, line []byte) {
		f, err := os.OpenFile(filepath.Join(dir, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	line := func(t *testing.T, dir string, i int) []byte {
		data, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
		if err != nil {
			t.Fatal(err)
		}
		return bytes.SplitAfter(data, []byte("\n"))[i]
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   error
	}{
		{"broken logprobs", func(t *testing.T, dir string) {
			edit(t, dir, 5, func(rec map[string]any) {
				r := response(rec, 1)
				r["logprobs"] = r["logprobs"].([]any)[1:]
			})
		}, ErrBadLogprobs},
		{"missing logprobs", func(t *testing.T, dir string) {
			edit(t, dir, 9, func(rec map[string]any) { delete(response(rec, 2), "logprobs") })
		}, ErrMissingLogprobs},
		{"a sample that cannot be written, then an attempt twice", func(t *testing.T, dir string) {
			edit(t, dir, 0, notExact)
			appendLine(t, dir, line(t, dir, 3))
		}, new(schema.DuplicateFinalError)},
		{"a sample that cannot be written, then a damaged line", func(t *testing.T, dir string) {
			edit(t, dir, 0, notExact)
			edit(t, dir, 7, func(rec map[string]any) { rec["schema"] = 7 })
		}, ErrDamagedRecords},
		{"a sample that cannot be written", func(t *testing.T, dir string) { edit(t, dir, 2, notExact) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			if _, err := benchrun.Generate(dir, benchrun.Run{Rollouts: 24, Steps: 3, Group: 4, PromptIDs: true}); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir)
			var errs [2]error
			for i, one := range []bool{true, false} {
				onePassExport = one
				out := filepath.Join(t.TempDir(), "out.jsonl")
				_, errs[i] = ExportSteps(dir, out, Options{Contiguous: true})
				if _, err := os.Stat(out); !os.IsNotExist(err) {
					t.Errorf("one pass %v: a refused export left %s (%v)", one, out, err)
				}
			}
			if errs[0] == nil || errs[1] == nil || errs[0].Error() != errs[1].Error() {
				t.Fatalf("one pass: %v\ntwo passes: %v\nwant the same error", errs[0], errs[1])
			}
			var dup *schema.DuplicateFinalError
			switch want := tc.want.(type) {
			case nil:
				if !strings.Contains(errs[0].Error(), "no exact generated token ids") {
					t.Errorf("error %v, want the sample's", errs[0])
				}
			case *schema.DuplicateFinalError:
				if !errors.As(errs[0], &dup) {
					t.Errorf("error %v, want a %T", errs[0], want)
				}
			default:
				if !errors.Is(errs[0], want) {
					t.Errorf("error %v, want %v", errs[0], want)
				}
			}
		})
	}
}
