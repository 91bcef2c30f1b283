package export_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/klauspost/compress/zstd"

	"legato/rl/export"
	"legato/rl/internal/benchrun"
	"legato/rl/schema"
)

func TestAdvantages(t *testing.T) {
	const pop, smp = schema.PopulationStd, schema.SampleStd
	tests := []struct {
		name    string
		kind    schema.AdvantageStd
		rewards []float64
		want    []float64
	}{
		{"two of four solved", pop, []float64{1, 0, 1, 0}, []float64{1, -1, 1, -1}},
		// "" is the default, population.
		{"two of four solved, no kind", "", []float64{1, 0, 1, 0}, []float64{1, -1, 1, -1}},
		// mean 1/2, sample std √(1/3): √(4/3) ≈ 1.155 times less.
		{"two of four solved, sample std", smp, []float64{1, 0, 1, 0}, []float64{math.Sqrt(3) / 2, -math.Sqrt(3) / 2, math.Sqrt(3) / 2, -math.Sqrt(3) / 2}},
		// mean 1/3, population std √2/3.
		{"one of three solved", pop, []float64{1, 0, 0}, []float64{math.Sqrt2, -1 / math.Sqrt2, -1 / math.Sqrt2}},
		// mean 1/3, sample std 1/√3.
		{"one of three solved, sample std", smp, []float64{1, 0, 0}, []float64{2 / math.Sqrt(3), -1 / math.Sqrt(3), -1 / math.Sqrt(3)}},
		// mean 1/2, sample std 1/√2: the smallest group with a signal.
		{"one of two solved, sample std", smp, []float64{1, 0}, []float64{1 / math.Sqrt2, -1 / math.Sqrt2}},
		// mean 1/2, population std 1/√6.
		{"partial credit", pop, []float64{0.5, 1, 0}, []float64{0, math.Sqrt(1.5), -math.Sqrt(1.5)}},
		{"all solved", pop, []float64{1, 1, 1, 1}, []float64{0, 0, 0, 0}},
		{"all solved, sample std", smp, []float64{1, 1, 1, 1}, []float64{0, 0, 0, 0}},
		{"all failed", pop, []float64{0, 0}, []float64{0, 0}},
		// The mean of three 0.1s is not exactly 0.1: equal rewards must
		// still give 0, not rounding noise divided by a tiny std.
		{"all equal fractions", pop, []float64{0.1, 0.1, 0.1}, []float64{0, 0, 0}},
		{"all equal fractions, sample std", smp, []float64{0.1, 0.1, 0.1}, []float64{0, 0, 0}},
		{"single attempt", pop, []float64{0.5}, []float64{0}},
		// n − 1 = 0: 0/0, a group without signal like an all-equal one.
		{"single attempt, sample std", smp, []float64{0.5}, []float64{0}},
		{"none", pop, []float64{}, []float64{}},
		{"none, sample std", smp, []float64{}, []float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := export.Advantages(tt.rewards, tt.kind)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("Advantages(%v, %q) (-want +got):\n%s", tt.rewards, tt.kind, diff)
			}
		})
	}
}

// TestAdvantagesUnknownKind: a kind that is neither std is a caller's bug
// (every entry point validates it), never a silent population std.
func TestAdvantagesUnknownKind(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"unbiased"`) {
			t.Errorf("Advantages with kind \"unbiased\": recovered %v, want a panic naming it", r)
		}
	}()
	export.Advantages([]float64{1, 0}, "unbiased")
}

// advantageFixture is testdata/advantages.json, written by
// testdata/advantages.py from Python's statistics module.
type advantageFixture struct {
	Groups []struct {
		Name       string    `json:"name"`
		Rewards    []float64 `json:"rewards"`
		Population []float64 `json:"population"`
		Sample     []float64 `json:"sample"`
	} `json:"groups"`
}

// TestAdvantagesReference compares Advantages with advantages computed
// independently, by Python's statistics.pstdev and statistics.stdev
// (testdata/advantages.py, no numpy), on groups of rewards like a batch's:
// binary and partial credit, G from 1 to 16, equal rewards.
func TestAdvantagesReference(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "advantages.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx advantageFixture
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Groups) < 10 {
		t.Fatalf("testdata/advantages.json holds %d groups; regenerate it with testdata/advantages.py", len(fx.Groups))
	}
	for _, g := range fx.Groups {
		for _, c := range []struct {
			kind schema.AdvantageStd
			want []float64
		}{{schema.PopulationStd, g.Population}, {schema.SampleStd, g.Sample}} {
			if len(c.want) != len(g.Rewards) {
				t.Fatalf("%s: %d %s advantages for %d rewards", g.Name, len(c.want), c.kind, len(g.Rewards))
			}
			got := export.Advantages(g.Rewards, c.kind)
			if diff := cmp.Diff(c.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("%s: Advantages(%v, %s) (-python +go):\n%s", g.Name, g.Rewards, c.kind, diff)
			}
		}
	}
}

func readSamples(t *testing.T, path string) []export.Sample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []export.Sample
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var s export.Sample
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("line %d: %v", len(out)+1, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// key identifies a sample in test tables.
type key struct {
	Rollout string
	Step    int
}

type expected struct {
	Reward, Advantage float64
}

// fixedSamples lists the samples of the fixed run, hand-computed from its
// description in fixedAttempts: group a's finished rewards are 1 and 0
// (advantages ±1; the surplus a2 is left out), group b's are equal and
// group c has one finished attempt (advantages 0).
func fixedSamples(dropConstant bool) map[key]expected {
	out := map[key]expected{}
	add := func(id string, steps int, reward, adv float64) {
		for s := range steps {
			out[key{id, s}] = expected{reward, adv}
		}
	}
	add("r-a0", 3, 1, 1)
	add("r-a1", 3, 0, -1)
	if !dropConstant {
		add("r-b0", 2, 1, 0)
		add("r-b1", 1, 1, 0)
		add("r-c1", 2, 0.5, 0)
	}
	return out
}

func TestExportSteps(t *testing.T) {
	tests := []struct {
		name      string
		opts      export.Options
		golden    string
		wantStats export.Stats
	}{
		// Group c's c1 has two steps without logprobs.
		{"refs", export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}, "export-refs.golden.jsonl",
			export.Stats{Lines: 11, Rollouts: 5, Groups: 3, Records: 11, MissingLogprobs: 2, BadLogprobs: 1}},
		{"inline images", export.Options{InlineImages: true, AllowMissingLogprobs: true, AllowBadLogprobs: true}, "export-inline.golden.jsonl",
			export.Stats{Lines: 11, Rollouts: 5, Groups: 3, Records: 11, MissingLogprobs: 2, BadLogprobs: 1}},
		// Group c is dropped, and with it every sample without logprobs.
		{"drop constant groups", export.Options{DropConstantGroups: true}, "export-drop.golden.jsonl",
			export.Stats{Lines: 6, Rollouts: 2, Groups: 1, DroppedGroups: 2, DroppedLines: 5, Records: 11}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "train.jsonl")
			st, err := export.ExportSteps(fixedRun, out, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			tt.wantStats.Bytes = int64(len(data))
			// batch.json records no std: it predates the setting.
			tt.wantStats.AdvantageStd, tt.wantStats.RecordedAdvantageStd = schema.PopulationStd, schema.PopulationStd
			if diff := cmp.Diff(tt.wantStats, st); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
			golden(t, tt.golden, data)

			samples := readSamples(t, out)
			got := map[key]expected{}
			for _, s := range samples {
				got[key{s.RolloutID, s.Step}] = expected{s.Reward, s.Advantage}
			}
			if diff := cmp.Diff(fixedSamples(tt.opts.DropConstantGroups), got); diff != "" {
				t.Errorf("rewards and advantages (-want +got):\n%s", diff)
			}
			checkAgainstRecords(t, samples, tt.opts.InlineImages)
		})
	}
}

// TestExportAdvantageStd: an export divides the advantages by the std the
// batch recorded unless told another, which its stats then tell apart
// from the batch's; an unknown kind is refused, naming it.
func TestExportAdvantageStd(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	b := `{"task_ids":["task-a","task-b","task-c"],"advantage_std":"sample"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, schema.BatchFile), []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	// Group a: rewards 1 and 0, whose sample std is 1/√2; groups b and c
	// have equal rewards.
	tests := []struct {
		name      string
		kind      schema.AdvantageStd
		wantStd   schema.AdvantageStd
		wantA0    float64
		wantOther float64
	}{
		{"the batch's", "", schema.SampleStd, 1 / math.Sqrt2, 0},
		{"the batch's, given", schema.SampleStd, schema.SampleStd, 1 / math.Sqrt2, 0},
		{"another", schema.PopulationStd, schema.PopulationStd, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "train.jsonl")
			st, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true, AdvantageStd: tt.kind})
			if err != nil {
				t.Fatal(err)
			}
			if st.AdvantageStd != tt.wantStd || st.RecordedAdvantageStd != schema.SampleStd {
				t.Errorf("stats: std %q, recorded %q; want %q and sample", st.AdvantageStd, st.RecordedAdvantageStd, tt.wantStd)
			}
			for _, s := range readSamples(t, out) {
				want := tt.wantOther
				switch s.RolloutID {
				case "r-a0":
					want = tt.wantA0
				case "r-a1":
					want = -tt.wantA0
				}
				if math.Abs(s.Advantage-want) > 1e-12 {
					t.Errorf("%s step %d: advantage %v, want %v", s.RolloutID, s.Step, s.Advantage, want)
				}
			}
		})
	}
	_, err := export.ExportSteps(dir, filepath.Join(t.TempDir(), "train.jsonl"), export.Options{AdvantageStd: "unbiased"})
	if err == nil || !strings.Contains(err.Error(), `AdvantageStd: advantage std "unbiased": want population or sample`) {
		t.Errorf("export with an unknown std: %v, want a refusal naming it", err)
	}
}

// checkAgainstRecords checks each sample against the record and step it
// came from: the prompt LoadRequest rebuilds, the response, the ids.
func checkAgainstRecords(t *testing.T, samples []export.Sample, inline bool) {
	t.Helper()
	recs := map[string]schema.Record{}
	if _, err := schema.ReadRunRecords(fixedRun, func(r schema.Record) error { recs[r.RolloutID] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	store, err := schema.OpenMessageStore(fixedRun, schema.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	withPromptIDs := 0
	for _, s := range samples {
		rec := recs[s.RolloutID]
		step := rec.Steps[s.Step]
		msgs, err := schema.LoadRequest(fixedRun, step, schema.LoadOptions{KeepImageRefs: !inline})
		if err != nil {
			t.Fatal(err)
		}
		promptIDs, err := schema.LoadPromptTokenIDs(fixedRun, step)
		if err != nil {
			t.Fatal(err)
		}
		if len(promptIDs) > 0 {
			withPromptIDs++
		}
		want := export.Sample{
			RolloutID: rec.RolloutID, TaskID: rec.TaskID, GroupID: rec.GroupID, Attempt: rec.Attempt,
			Step: s.Step, Status: rec.Status, PolicyVersion: rec.Policy.Version, Reward: *rec.Reward,
			Advantage: s.Advantage, Messages: msgs, PromptTokenIDs: promptIDs,
			ResponseText: step.Response.Content, ResponseReasoning: step.Response.Reasoning,
			ResponseTokenIDs: step.Response.TokenIDs, ResponseLogprobs: step.Response.Logprobs,
			ResponseTokens: step.Response.Tokens, TokenIDsSource: step.Response.TokenIDsSource,
			FinishReason: step.Response.FinishReason, Warnings: step.Warnings,
		}
		if step.LogprobDefect() != "" {
			want.ResponseLogprobs = nil // exported unusable, not as it came
		}
		for _, img := range wantImages(t, store, step, export.DefaultImageTokenID) {
			want.Images = append(want.Images, export.StepImage{SHA256: img.SHA256, Bytes: img.Bytes, Width: img.Width, Height: img.Height, TokenSpan: img.Span})
		}
		if diff := cmp.Diff(want, s); diff != "" {
			t.Errorf("sample %s step %d (-want +got):\n%s", s.RolloutID, s.Step, diff)
		}
		for _, m := range s.Messages {
			for _, p := range m.Content {
				if p.ImageURL == nil {
					continue
				}
				if isRef := strings.HasPrefix(p.ImageURL.URL, schema.ImageScheme); isRef == inline {
					t.Errorf("sample %s step %d: image %.40q with inline=%v", s.RolloutID, s.Step, p.ImageURL.URL, inline)
				}
			}
		}
	}
	// The fixed run gives prompt ids to every step with exact ids.
	if withPromptIDs == 0 {
		t.Error("no sample has prompt token ids")
	}
}

// TestExportTornLine exports a run whose last line was torn by a crash:
// the samples are those of the intact run, and the torn line is reported.
func TestExportTornLine(t *testing.T) {
	dir := tornCopy(t)
	out := filepath.Join(t.TempDir(), "train.jsonl")
	st, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.TornLines != 1 || st.FirstTorn == nil || st.FirstTorn.Line != 12 {
		t.Errorf("TornLines = %d, FirstTorn = %v; want 1 torn line at line 12", st.TornLines, st.FirstTorn)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "export-refs.golden.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("export of the torn run (-want +got):\n%s", diff)
	}
}

// TestExportErrors checks that a failed export names what failed and
// leaves neither the output file nor a temp file behind.
func TestExportErrors(t *testing.T) {
	missingMessage := func(t *testing.T) string {
		// The older run's messages are files of their own, which a test
		// can take away (schema's tests take objects out of packs).
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.CopyFS(dir, os.DirFS(looseRun)); err != nil {
			t.Fatal(err)
		}
		var hash string
		schema.ReadRunRecords(dir, func(r schema.Record) error {
			if r.RolloutID == "r-b0" {
				hash = r.Steps[1].Request[3]
			}
			return nil
		})
		if err := os.Remove(filepath.Join(dir, schema.MessagesDir, hash)); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		dir     func(t *testing.T) string
		wantIs  error
		wantMsg string
	}{
		{"no run", context.Background(), func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") },
			fs.ErrNotExist, "rollouts.jsonl"},
		{"missing message", context.Background(), missingMessage, schema.ErrNotFound, "rollout r-b0 step 1"},
		{"cancelled", cancelled, func(*testing.T) string { return fixedRun }, context.Canceled, "export testdata/run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outDir := t.TempDir()
			out := filepath.Join(outDir, "train.jsonl")
			_, err := export.ExportStepsContext(tt.ctx, tt.dir(t), out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
			if !errors.Is(err, tt.wantIs) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %v, want one matching %v that says %q", err, tt.wantIs, tt.wantMsg)
			}
			if left := listDir(t, outDir); len(left) != 0 {
				t.Errorf("left behind %q", left)
			}
		})
	}
}

// TestExportRefusesMissingLogprobs checks that an export with samples
// without logprobs fails, naming how many and the first, and writes
// nothing, unless they are allowed.
func TestExportRefusesMissingLogprobs(t *testing.T) {
	outDir := t.TempDir()
	out := filepath.Join(outDir, "train.jsonl")
	_, err := export.ExportSteps(fixedRun, out, export.Options{AllowBadLogprobs: true})
	var miss *export.MissingLogprobsError
	if !errors.As(err, &miss) || !errors.Is(err, export.ErrMissingLogprobs) {
		t.Fatalf("ExportSteps = %v, want a *MissingLogprobsError", err)
	}
	want := export.MissingLogprobsError{Samples: 2, Total: 11, FirstRollout: "r-c1", FirstStep: 0}
	if diff := cmp.Diff(want, *miss); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	for _, s := range []string{"2 of 11 samples have no logprobs", "rollout r-c1 step 0", "--allow-missing-logprobs"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if left := listDir(t, outDir); len(left) != 0 {
		t.Errorf("a refused export left %q", left)
	}
}

// nonFiniteCopy copies the fixed run and marks some steps of finished
// attempts as collect records a server's null logprobs: dropped, with
// their warning. The fixed run already has a mismatch (r-b0 step 1).
func nonFiniteCopy(t *testing.T, steps map[string]int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for line := range strings.Lines(string(data)) {
		var rec schema.Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if i, ok := steps[rec.RolloutID]; ok {
			rec.Steps[i].Response.Logprobs = nil
			rec.Steps[i].Warnings = append(rec.Steps[i].Warnings, schema.WarnNonFiniteLogprobs)
		}
		b, err := json.Marshal(&rec)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, b...), '\n')
	}
	if err := os.WriteFile(path, out, 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportRefusesBadLogprobs checks that an export with samples whose
// logprobs came null or misaligned fails, naming how many of each and
// their rollouts, and writes nothing; and that with AllowBadLogprobs they
// are written without logprobs and marked.
func TestExportRefusesBadLogprobs(t *testing.T) {
	dir := nonFiniteCopy(t, map[string]int{"r-a0": 0, "r-a1": 2})
	outDir := t.TempDir()
	out := filepath.Join(outDir, "train.jsonl")
	_, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true})
	var bad *export.BadLogprobsError
	if !errors.As(err, &bad) || !errors.Is(err, export.ErrBadLogprobs) {
		t.Fatalf("ExportSteps = %v, want a *BadLogprobsError", err)
	}
	slices.Sort(bad.Rollouts)
	want := export.BadLogprobsError{Samples: 3, Total: 11, NonFinite: 2, Mismatch: 1, RolloutCount: 3, Rollouts: []string{"r-a0", "r-a1", "r-b0"}}
	if diff := cmp.Diff(want, *bad); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	for _, s := range []string{"3 of 11 samples have broken logprobs", "2 null, NaN or infinite", "1 not one per token id", "--allow-bad-logprobs"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if left := listDir(t, outDir); len(left) != 0 {
		t.Errorf("a refused export left %q", left)
	}

	st, err := export.ExportSteps(dir, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.BadLogprobs != 3 || st.MissingLogprobs != 2 {
		t.Errorf("stats say %d bad and %d missing logprobs, want 3 and 2", st.BadLogprobs, st.MissingLogprobs)
	}
	marked := map[string]string{"r-a0/0": schema.WarnNonFiniteLogprobs, "r-a1/2": schema.WarnNonFiniteLogprobs, "r-b0/1": schema.WarnLogprobsMismatch}
	for _, s := range readSamples(t, out) {
		k := fmt.Sprintf("%s/%d", s.RolloutID, s.Step)
		w, isBad := marked[k]
		if isBad && (s.ResponseLogprobs != nil || !slices.Contains(s.Warnings, w)) {
			t.Errorf("sample %s has logprobs %v and warnings %q, want none and %s", k, s.ResponseLogprobs, s.Warnings, w)
		}
		if !isBad && s.RolloutID != "r-c1" && len(s.ResponseLogprobs) != len(s.ResponseTokenIDs)+len(s.ResponseTokens) {
			t.Errorf("sample %s lost its logprobs: %v", k, s.ResponseLogprobs)
		}
	}
}

// damagedCopy copies the fixed run and cuts its line n (from 1) in the
// middle, keeping the newline: damage from outside, not a crash
// mid-append, which only ever tears the last line.
func damagedCopy(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, schema.RecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[n-1] = lines[n-1][:len(lines[n-1])/2] + "\n"
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportRefusesDamagedRecords cuts r-a1, the record that gives group a
// its second finished reward: skipping it would export a0 with advantage 0
// instead of +1. The export fails naming the line, torn tail or not.
func TestExportRefusesDamagedRecords(t *testing.T) {
	for _, tornTail := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn tail %v", tornTail), func(t *testing.T) {
			dir := damagedCopy(t, 6)
			if tornTail {
				f, err := os.OpenFile(filepath.Join(dir, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteString(`{"schema":"legato.rollout/v0","rollout_id":"r-torn"`)
				f.Close()
			}
			outDir := t.TempDir()
			st, err := export.ExportSteps(dir, filepath.Join(outDir, "train.jsonl"), export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
			var line *schema.LineError
			if !errors.Is(err, export.ErrDamagedRecords) || !errors.As(err, &line) || line.Line != 6 {
				t.Fatalf("ExportSteps = %v, want ErrDamagedRecords at line 6", err)
			}
			if !strings.Contains(err.Error(), "rollouts.jsonl line 6") {
				t.Errorf("error %q does not name the line", err)
			}
			if st.Lines != 0 {
				t.Errorf("wrote %d samples, want none", st.Lines)
			}
			if left := listDir(t, outDir); len(left) != 0 {
				t.Errorf("a refused export left %q", left)
			}
		})
	}
}

// TestExportRefusesRunFiles checks that the output cannot replace one of
// the run's own files, and that a new file in the run directory is fine.
func TestExportRefusesRunFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{schema.RecordsFile, schema.BatchFile, schema.SummaryFile} {
		path := filepath.Join(dir, name)
		before, _ := os.ReadFile(path)
		_, err := export.ExportSteps(dir, path, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
		if !errors.Is(err, schema.ErrRunFile) {
			t.Errorf("export to %s = %v, want schema.ErrRunFile", name, err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Errorf("a refused export changed %s", name)
		}
	}
	if _, err := export.ExportSteps(dir, filepath.Join(dir, "train.jsonl"), export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}); err != nil {
		t.Errorf("export into a new file of the run directory: %v", err)
	}
}

// TestSummarize checks the fixed run's summary against hand-counted
// values, then pins every field in a golden file.
func TestSummarize(t *testing.T) {
	s, st, err := export.Summarize(fixedRun)
	if err != nil {
		t.Fatal(err)
	}
	if st.Records != 11 || st.TornLines != 0 {
		t.Errorf("read %d records, %d torn lines; want 11, 0", st.Records, st.TornLines)
	}
	type counted struct {
		Tasks, Groups, Records     int
		Counts                     map[schema.Status]int
		SuccessRate, SolvedShare   float64
		GroupsWithVariance         int
		ModelCalls, RetriedCalls   int
		PolicyErrors, EnvErrors    int
		StepsWithLogprobs, WithIDs float64
	}
	want := counted{
		Tasks: 3, Groups: 3, Records: 11,
		Counts: map[schema.Status]int{"ok": 4, "truncated": 1, "cancelled": 1, "skipped": 1, "surplus": 1, "retried": 1, "error": 2},
		// Finished rewards 1, 0, 1, 1, 0.5: three of five solved.
		SuccessRate: 3.5 / 5, SolvedShare: 3.0 / 5,
		GroupsWithVariance: 1, // group a
		// Steps: a0 3, a2 2, a1 3, b0 2, b1 1, b2 1, c0 1, c1 2, c2 1.
		ModelCalls: 16, RetriedCalls: 1,
		PolicyErrors: 1, EnvErrors: 1,
		// No logprobs: c1's 2 steps and c0's failed call; no ids: a1's 3
		// steps and c0's failed call.
		StepsWithLogprobs: 13.0 / 16, WithIDs: 12.0 / 16,
	}
	got := counted{s.Tasks, s.Groups, s.Records, s.Counts, s.SuccessRate, s.SolvedShare, s.GroupsWithVariance,
		s.ModelCalls, s.RetriedCalls, s.PolicyErrors, s.EnvErrors, s.StepsWithLogprobs, s.StepsWithTokenIDs}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	var shares float64
	for _, v := range s.PhaseShare {
		shares += v
	}
	if math.Abs(shares-1) > 1e-9 {
		t.Errorf("phase shares sum to %v, want 1: %v", shares, s.PhaseShare)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "summary.golden.json", append(b, '\n'))

	torn, st, err := export.Summarize(tornCopy(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.TornLines != 1 || torn.TornLines != 1 {
		t.Errorf("torn run: ReadStats.TornLines %d, Summary.TornLines %d; want 1", st.TornLines, torn.TornLines)
	}
	if n := len(torn.Warnings); n == 0 || !strings.Contains(torn.Warnings[n-1], "1 unreadable lines") {
		t.Errorf("torn run's warnings %q do not name the unreadable line", torn.Warnings)
	} else {
		torn.Warnings = torn.Warnings[:n-1]
	}
	torn.TornLines = 0
	if diff := cmp.Diff(s, torn); diff != "" {
		t.Errorf("summary of the torn run differs beyond TornLines (-want +got):\n%s", diff)
	}
}

// TestSummaryBuilderIncremental checks that summaries taken while records
// arrive, as collect does, end equal to one taken at the end.
func TestSummaryBuilderIncremental(t *testing.T) {
	var recs []schema.Record
	if _, err := schema.ReadRunRecords(fixedRun, func(r schema.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	policy := schema.Policy{Model: "qwen3-vl-8b", Version: "v7"}
	once := export.NewSummaryBuilder(policy, 3, 3)
	often := export.NewSummaryBuilder(policy, 3, 3)
	for i := range recs {
		once.Add(&recs[i])
		often.Add(&recs[i])
		if s := often.Summary(); s.Records != i+1 || s.Schema != schema.SummaryVersion {
			t.Fatalf("after %d records: Records %d, Schema %q", i+1, s.Records, s.Schema)
		}
	}
	if diff := cmp.Diff(once.Summary(), often.Summary()); diff != "" {
		t.Errorf("(-once +often):\n%s", diff)
	}
	first, last, ok := once.Window()
	wantFirst, wantLast := t0, recs[len(recs)-1].EndedAt.Time
	if !ok || !first.Equal(wantFirst) || !last.Equal(wantLast) {
		t.Errorf("Window() = %v, %v, %v; want %v, %v, true", first, last, ok, wantFirst, wantLast)
	}
}

// TestTimeline checks the layout of r-a0 against its construction in
// buildRecord: reset 4, wait 2, first observation 0.5, then per step its
// queueing, its call and one action (act 0.25, wait 1.5, obs 0.5), then
// the wait before grading 1 and grading 1.5.
func TestTimeline(t *testing.T) {
	var a0 schema.Record
	schema.ReadRunRecords(fixedRun, func(r schema.Record) error {
		if r.RolloutID == "r-a0" {
			a0 = r
		}
		return nil
	})
	type span struct {
		Phase      string
		Start, End float64 // seconds from t0
	}
	want := []span{
		{"reset_s", 0, 4}, {"wait_after_reset_s", 4, 6}, {"obs_s", 6, 6.5},
		{"model_s", 6.5, 8}, {"act_s", 8, 8.25}, {"wait_s", 8.25, 9.75}, {"obs_s", 9.75, 10.25},
		{"queue_s", 10.25, 10.5}, {"model_s", 10.5, 12.75}, {"act_s", 12.75, 13}, {"wait_s", 13, 14.5}, {"obs_s", 14.5, 15},
		{"model_s", 15, 16.75}, {"act_s", 16.75, 17}, {"wait_s", 17, 18.5}, {"obs_s", 18.5, 19},
		{"wait_before_eval_s", 19, 20}, {"eval_s", 20, 21.5},
	}
	var got []span
	for _, s := range export.Timeline(&a0) {
		got = append(got, span{s.Phase, s.Start.Sub(t0).Seconds(), s.End.Sub(t0).Seconds()})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Timeline(r-a0) (-want +got):\n%s", diff)
	}
	if got := export.Timeline(&schema.Record{}); got != nil {
		t.Errorf("Timeline of a record without a start = %v, want nil", got)
	}
}

// TestTimelineQueueAnchored checks that a step's recorded start wins over
// the summed durations: a gap before queueing is left to no phase.
func TestTimelineQueueAnchored(t *testing.T) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := &schema.Record{
		Timing: schema.Timing{ResetS: 1, QueueS: 2, ModelS: 1},
		Steps: []schema.Step{{
			StartedAt: schema.Time{Time: at.Add(5 * time.Second)},
			Model:     schema.ModelCall{Seconds: 1, QueueS: 2},
		}},
		StartedAt: schema.Time{Time: at},
	}
	var got []string
	for _, s := range export.Timeline(rec) {
		got = append(got, s.Phase+" "+s.Start.Sub(at).String()+"-"+s.End.Sub(at).String())
	}
	want := []string{"reset_s 0s-1s", "queue_s 3s-5s", "model_s 5s-6s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestExportParallel: records encoded by several workers come out in the
// order of rollouts.jsonl, byte for byte what one worker writes, prompt
// token ids included.
func TestExportParallel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := (benchrun.Run{Rollouts: 96, Steps: 3, Group: 4, PromptIDs: true}).Write(dir); err != nil {
		t.Fatal(err)
	}
	export1 := func(procs int) []byte {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		out := filepath.Join(t.TempDir(), "train.jsonl")
		st, err := export.ExportSteps(dir, out, export.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Lines != 96*3 || st.Rollouts != 96 || st.Groups != 24 {
			t.Errorf("GOMAXPROCS %d: %d lines, %d rollouts, %d groups; want 288, 96, 24", procs, st.Lines, st.Rollouts, st.Groups)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	one, four := export1(1), export1(4)
	if !bytes.Equal(one, four) {
		t.Fatalf("four workers wrote other bytes than one (%d vs %d bytes)", len(four), len(one))
	}
	samples := readSamples(t, writeTemp(t, one))
	for i, s := range samples {
		if want := fmt.Sprintf("r-%05d", i/3); s.RolloutID != want || s.Step != i%3 {
			t.Fatalf("line %d: rollout %s step %d; want %s step %d", i+1, s.RolloutID, s.Step, want, i%3)
		}
		if len(s.PromptTokenIDs) != 2000+300*s.Step {
			t.Fatalf("line %d: %d prompt ids; want %d", i+1, len(s.PromptTokenIDs), 2000+300*s.Step)
		}
	}
}

func writeTemp(t *testing.T, b []byte) string {
	p := filepath.Join(t.TempDir(), "samples.jsonl")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// looseRun is a run written before packs and binary token chunks: each
// message and token chunk is a file of its own, the chunks are the
// canonical JSON of TokenChunk ids each, cut from the start of every
// prompt, and its steps carry no id count. It is kept as written then
// (TestMain's -update leaves it alone).
const looseRun = "testdata/run-loose"

// TestExportLooseRun: a run of loose objects and JSON token chunks exports
// exactly as the same run stored today does, in each shape.
func TestExportLooseRun(t *testing.T) {
	for _, tt := range []struct {
		golden string
		opts   export.Options
	}{
		{"export-refs.golden.jsonl", export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true}},
		{"export-inline.golden.jsonl", export.Options{InlineImages: true, AllowMissingLogprobs: true, AllowBadLogprobs: true}},
		{"export-drop.golden.jsonl", export.Options{DropConstantGroups: true}},
	} {
		out := filepath.Join(t.TempDir(), "train.jsonl")
		if _, err := export.ExportSteps(looseRun, out, tt.opts); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("testdata", tt.golden))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("export of %s differs from %s", looseRun, tt.golden)
		}
	}
	// The fixture still holds what it is kept for.
	entries, err := os.ReadDir(filepath.Join(looseRun, schema.TokensDir))
	if err != nil || len(entries) == 0 {
		t.Fatalf("%s has no token chunks: %v", looseRun, err)
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(looseRun, schema.TokensDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		content, err := dec.DecodeAll(b, nil)
		if err != nil || !bytes.HasPrefix(content, []byte("[")) {
			t.Errorf("chunk %s is not a JSON chunk (%v)", e.Name(), err)
		}
	}
}
