package export_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/schema"
)

var update = flag.Bool("update", false, "rewrite testdata: the fixed run directory and the golden files")

func TestMain(m *testing.M) {
	flag.Parse()
	if *update {
		// Before the golden tests, which read the fixed run.
		if err := os.RemoveAll(fixedRun); err != nil {
			panic(err)
		}
		if err := writeFixedRun(fixedRun); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}

// fixedRun is the run directory the golden tests read, written by
// writeFixedRun (go test -update rewrites it).
const fixedRun = "testdata/run"

// tinyPNG is a 1×1 PNG. Screenshots of the fixed run are copies of it with
// a text chunk naming the step, fixed bytes that do not depend on Go's PNG
// encoder.
var tinyPNG, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

// screenshot returns a distinct small PNG data URL for text.
func screenshot(text string) string {
	iend := len(tinyPNG) - 12 // IEND is the last chunk: length, type, CRC
	data := append([]byte("legato\x00"), text...)
	var chunk bytes.Buffer
	binary.Write(&chunk, binary.BigEndian, uint32(len(data)))
	chunk.WriteString("tEXt")
	chunk.Write(data)
	binary.Write(&chunk, binary.BigEndian, crc32.ChecksumIEEE(chunk.Bytes()[4:]))
	p := append([]byte(nil), tinyPNG[:iend]...)
	p = append(p, chunk.Bytes()...)
	p = append(p, tinyPNG[iend:]...)
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(p)
}

// attemptSpec describes one record of the fixed run. Durations are binary
// fractions, so times and JSON numbers are exact.
type attemptSpec struct {
	id      string
	task    string
	attempt int
	desktop int
	status  schema.Status
	reward  *float64
	err     *schema.ErrorInfo
	// model holds the model seconds of each step; queue its queueing.
	model []float64
	queue []float64
	// graded attempts end with the wait before grading and grading.
	graded bool
	// noReset: the attempt failed while resetting (retried) or never ran
	// (skipped); resetS is how long it got.
	resetS float64
	// noTokenIDs: the server gave token strings, not ids; noLogprobs: none.
	noTokenIDs, noLogprobs bool
}

func reward(r float64) *float64 { return &r }

var (
	t0     = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	policy = schema.Policy{Model: "qwen3-vl-8b", Version: "v7"}
	tasks  = map[string]string{"task-a": "chrome", "task-b": "gimp", "task-c": "os"}
)

// fixedAttempts is the batch: three tasks, groups of G=2 with one
// oversampled attempt, two desktops, every status. Each desktop runs its
// attempts back to back; the order per desktop is the list order.
//
//	group a: a0 ok 1, a1 retried then a1 truncated 0, a2 surplus 1  → advantages +1, −1
//	group b: b0 ok 1, b1 ok 1, b2 cancelled, b3 skipped            → equal rewards, 0
//	group c: c0 error policy, c1 ok 0.5, c2 error env              → one finished, 0
func fixedAttempts() []attemptSpec {
	return []attemptSpec{
		{id: "r-a0", task: "task-a", attempt: 0, desktop: 0, status: schema.StatusOK, reward: reward(1),
			model: []float64{1.5, 2.25, 1.75}, queue: []float64{0, 0.25, 0}, graded: true},
		{id: "r-a1-try0", task: "task-a", attempt: 1, desktop: 1, status: schema.StatusRetried,
			err: &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "reset: guest server did not answer"}, resetS: 6},
		{id: "r-a2", task: "task-a", attempt: 2, desktop: 1, status: schema.StatusSurplus, reward: reward(1),
			model: []float64{2, 3}, queue: []float64{0.5, 0}, graded: true},
		{id: "r-a1", task: "task-a", attempt: 1, desktop: 0, status: schema.StatusTruncated, reward: reward(0),
			model: []float64{1.25, 1.5, 4}, queue: []float64{0, 0, 0.75}, graded: true, noTokenIDs: true},
		{id: "r-b0", task: "task-b", attempt: 0, desktop: 1, status: schema.StatusOK, reward: reward(1),
			model: []float64{1, 2.5}, queue: []float64{0, 0}, graded: true},
		{id: "r-b1", task: "task-b", attempt: 1, desktop: 0, status: schema.StatusOK, reward: reward(1),
			model: []float64{1.75}, queue: []float64{0.25}, graded: true},
		{id: "r-b2", task: "task-b", attempt: 2, desktop: 0, status: schema.StatusCancelled,
			model: []float64{2}, queue: []float64{0}},
		{id: "r-b3", task: "task-b", attempt: 3, desktop: 1, status: schema.StatusSkipped},
		{id: "r-c0", task: "task-c", attempt: 0, desktop: 1, status: schema.StatusError,
			err:   &schema.ErrorInfo{Kind: schema.ErrorPolicy, Message: "model call: 3 attempts: 503 Service Unavailable"},
			model: []float64{1}, queue: []float64{0}},
		{id: "r-c1", task: "task-c", attempt: 1, desktop: 0, status: schema.StatusOK, reward: reward(0.5),
			model: []float64{3.5, 0.75}, queue: []float64{0, 0}, graded: true, noLogprobs: true},
		{id: "r-c2", task: "task-c", attempt: 2, desktop: 1, status: schema.StatusError,
			err:   &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: "act: guest server crashed"},
			model: []float64{1.25}, queue: []float64{0}},
	}
}

// Phase durations of the fixed run, in seconds.
const (
	resetS, waitAfterResetS, firstObsS = 4, 2, 0.5
	actS, waitS, readyS, obsS          = 0.25, 1.5, 1, 0.5
	waitBeforeEvalS, evalS, overheadS  = 1, 1.5, 0.25
	gapS                               = 0.5 // between attempts on a desktop
)

// buildRecord lays out one attempt starting at start and stores its
// prompts in run.
func buildRecord(run *schema.Run, a attemptSpec, start time.Time) (*schema.Record, error) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	rec := &schema.Record{
		RolloutID: a.id,
		TaskID:    a.task,
		Domain:    tasks[a.task],
		GroupID:   policy.Version + "/" + a.task,
		Attempt:   a.attempt,
		Policy:    policy,
		Status:    a.status,
		Reward:    a.reward,
		Error:     a.err,
		Desktop:   a.desktop,
		StartedAt: schema.Time{Time: start},
	}
	tm := &rec.Timing
	cur := start
	spend := func(field *float64, s float64) {
		*field += s
		cur = cur.Add(sec(s))
	}
	switch {
	case a.status == schema.StatusSkipped:
	case a.resetS > 0:
		spend(&tm.ResetS, a.resetS)
	default:
		spend(&tm.ResetS, resetS)
		spend(&tm.WaitAfterResetS, waitAfterResetS)
		spend(&tm.ObsS, firstObsS)
	}

	system := schema.Message{Role: "system", Content: []schema.Part{schema.TextPart("You control a computer with the computer_use tool.")}}
	instruction := schema.Message{Role: "user", Content: []schema.Part{
		schema.TextPart("Task " + a.task + ": do what the task says."),
		schema.ImagePart(screenshot(a.id + " step 0")),
	}}
	prompt := []schema.Message{system, instruction}
	promptIDs := run.NewTokenWriter()
	for k, m := range a.model {
		spend(&tm.QueueS, a.queue[k])
		last := k == len(a.model)-1
		content := fmt.Sprintf(`<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [%d, %d]}}</tool_call>`, 100+10*k, 200+20*k)
		action := fmt.Sprintf("import pyautogui; pyautogui.click(%d, %d)", 192+19*k, 216+22*k)
		if last && a.graded && a.status == schema.StatusOK {
			content = `<tool_call>{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}</tool_call>`
			action = "DONE"
		}
		hashes, err := run.PutMessages(prompt)
		if err != nil {
			return nil, err
		}
		step := schema.Step{
			Request:   hashes,
			StartedAt: schema.Time{Time: cur},
			Response: schema.Response{
				Content:        content,
				Reasoning:      fmt.Sprintf("Step %d: the target is visible.", k),
				TokenIDs:       []int64{151657, int64(1000 + k), int64(2000 + k)},
				Logprobs:       []float64{-0.125, -0.5 * float64(k+1), -0.0625},
				TokenIDsSource: schema.SourceReturnTokenIDs,
				FinishReason:   "stop",
			},
			Model: schema.ModelCall{
				Seconds: m, QueueS: a.queue[k], Attempts: 1,
				PromptTokens: 1024 + 256*k, CompletionTokens: 3, CachedTokens: new(256 * k),
			},
		}
		if a.noTokenIDs {
			step.Response.TokenIDs = nil
			step.Response.Tokens = []string{"<tool_call>", fmt.Sprint(k), "}"}
			step.Response.TokenIDsSource = schema.SourceStrings
		} else {
			// The prompt as the server tokenized it: it grows by the
			// reply and the next screenshot each step, sharing its start.
			ids := make([]int64, 0, 6+2*k)
			for j := range 6 + 2*k {
				ids = append(ids, int64(151644+j%7))
			}
			if step.PromptTokenChunks, err = promptIDs.Put(ids); err != nil {
				return nil, err
			}
			step.PromptTokenCount = len(ids)
		}
		if a.noLogprobs {
			step.Response.Logprobs = nil
		}
		if a.id == "r-b0" && k == 1 {
			step.Response.Logprobs = step.Response.Logprobs[:2]
			step.Warnings = []string{"logprobs_token_ids_mismatch"}
		}
		if a.id == "r-a0" && k == 1 {
			step.Model.Attempts = 2 // a retried call
			step.Model.CachedTokens = nil
		}
		spend(&tm.ModelS, m)
		rec.Steps = append(rec.Steps, step)
		if a.status == schema.StatusError && a.err.Kind == schema.ErrorPolicy {
			// The call failed: the step's reply is what the last try
			// got, nothing, and no action ran.
			rec.Steps[len(rec.Steps)-1].Response = schema.Response{}
			break
		}
		rec.Steps[len(rec.Steps)-1].Actions = []schema.ActionRecord{{
			Action: action, ActS: actS, WaitS: waitS, ReadyS: readyS, ObsS: obsS,
			Unsettled: a.id == "r-a0" && k == 1, // a wait that ran out
		}}
		spend(&tm.ActS, actS)
		spend(&tm.WaitS, waitS)
		spend(&tm.ObsS, obsS)
		prompt = append(prompt,
			schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(content)}},
			schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(screenshot(fmt.Sprintf("%s step %d", a.id, k+1)))}},
		)
	}
	rec.NSteps = len(rec.Steps)
	if a.graded {
		spend(&tm.WaitBeforeEvalS, waitBeforeEvalS)
		spend(&tm.EvalS, evalS)
	}
	if a.status != schema.StatusSkipped {
		cur = cur.Add(sec(overheadS))
	}
	tm.TotalS = cur.Sub(start).Seconds()
	rec.EndedAt = schema.Time{Time: cur}
	return rec, nil
}

// writeFixedRun writes the fixed run into dir: the attempts of each desktop
// back to back from t0, records appended in order of their end.
func writeFixedRun(dir string) (err error) {
	run, err := schema.Create(dir)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := run.Close(); err == nil {
			err = cerr
		}
	}()
	free := map[int]time.Time{0: t0, 1: t0.Add(250 * time.Millisecond)}
	var recs []*schema.Record
	for _, a := range fixedAttempts() {
		rec, err := buildRecord(run, a, free[a.desktop])
		if err != nil {
			return err
		}
		if a.status != schema.StatusSkipped {
			free[a.desktop] = rec.EndedAt.Add(gapS * 1000 * time.Millisecond)
		}
		recs = append(recs, rec)
	}
	slices.SortStableFunc(recs, func(a, b *schema.Record) int { return a.EndedAt.Compare(b.EndedAt.Time) })
	for _, rec := range recs {
		if err := run.Append(rec); err != nil {
			return err
		}
	}
	batch, err := json.Marshal(map[string]any{"task_ids": []string{"task-a", "task-b", "task-c"}})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "batch.json"), append(batch, '\n'), 0o644)
}

// TestFixedRun checks that testdata/run is what writeFixedRun writes, so
// the golden files describe the run the generator documents; -update
// rewrites it.
func TestFixedRun(t *testing.T) {
	dir := t.TempDir()
	if err := writeFixedRun(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{schema.RecordsFile, "batch.json"} {
		want, err := os.ReadFile(filepath.Join(fixedRun, name))
		if err != nil {
			t.Fatalf("%v (run go test -update to create it)", err)
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	// Stored objects are named by the hash of their content; compressed
	// bytes may differ between zstd releases, the names may not.
	for _, sub := range []string{schema.MessagesDir, schema.ImagesDir, schema.TokensDir} {
		if diff := cmp.Diff(listDir(t, filepath.Join(fixedRun, sub)), listDir(t, filepath.Join(dir, sub))); diff != "" {
			t.Errorf("%s/ (-want +got):\n%s", sub, diff)
		}
	}
}

func listDir(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// tornCopy copies the fixed run into a temp dir and appends the start of
// a record without its newline, as a crash mid-append leaves it.
func tornCopy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, schema.RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`{"schema":"legato.rollout/v0","rollout_id":"r-torn","status":"ok","rew`); err != nil {
		t.Fatal(err)
	}
	return dir
}
