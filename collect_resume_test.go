package rl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// realisticDesk has a VM's latencies, in seconds, as OSWorld's desktops
// show them.
func realisticDesk() fake.Config {
	return fake.Config{
		Latency: fake.Latencies{
			Reset:    fake.Latency{Median: 2 * time.Second, Sigma: 0.3},
			Observe:  fake.Latency{Fixed: 100 * time.Millisecond},
			Act:      fake.Latency{Median: 300 * time.Millisecond, Sigma: 0.3},
			Settle:   fake.Latency{Max: time.Second},
			Evaluate: fake.Latency{Median: time.Second, Sigma: 0.5},
		},
		DefaultReward: fake.Reward{P: 0.5},
	}
}

// flatServer answers in about 2 s whatever the load.
func flatServer(script func(policytest.Request) string) policytest.Options {
	return policytest.Options{
		Script:  script,
		Latency: policytest.Latency{Base: 2 * time.Second, Knee: 1 << 20, Capacity: 1 << 20},
	}
}

// TestCollectCancel stops a batch the way Ctrl-C does, in the middle, and
// resumes it: the stopped run returns ctx's error with a summary, closes
// every desktop and leaves no call in flight; the resumed run keeps every
// record and runs only what is missing.
func TestCollectCancel(t *testing.T) {
	for _, at := range []time.Duration{time.Second, 15 * time.Second, 40 * time.Second} {
		t.Run(at.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newBatchEnv(t, testTasks(6), flatServer(nil), realisticDesk())
				e.opts.Desktops = 3
				e.opts.Oversample = 0.5
				ctx, cancel := context.WithCancel(t.Context())
				stop := time.AfterFunc(at, cancel)
				defer stop.Stop()
				sum, err := e.collect(ctx)
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Collect after Ctrl-C: %v, want context.Canceled", err)
				}
				if sum == nil {
					t.Fatal("Collect after Ctrl-C returned no summary")
				}
				synctest.Wait()
				if n := e.srv.Stats().InFlight; n != 0 {
					t.Errorf("%d model calls still in flight after Collect returned", n)
				}
				checkClosed(t, e.fleet)
				before := checkBatch(t, e, sum, false)
				if len(before) == len(e.tasks)*AttemptsPerTask(2, 0.5) {
					t.Fatalf("the batch ended before the cancel at %v; cancel earlier", at)
				}
				file, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
				if err != nil {
					t.Fatal(err)
				}

				e.fleet = fake.NewFleet(withTestScreen(realisticDesk()))
				e.opts.NewDesktop = e.fleet.New
				e.groups = nil
				sum, err = e.collect(t.Context())
				if err != nil {
					t.Fatalf("resumed Collect: %v", err)
				}
				after := checkBatch(t, e, sum, true)
				checkClosed(t, e.fleet)
				resumed, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasPrefix(resumed, file) {
					t.Errorf("the resumed batch changed the records of the stopped one")
				}
				t.Logf("cancelled at %v with %d records, resumed to %d", at, len(before), len(after))
			})
		})
	}
}

// TestExportLeavesOutWhatCollectCutShort stops a batch the way SIGTERM
// does and exports it: export writes exactly the groups with finished
// attempts that the scheduler ended (OnGroup's), and leaves out, naming
// them, those the stop cut short. Once the batch is resumed to its end, it
// leaves none out.
func TestExportLeavesOutWhatCollectCutShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Groups of 4 on 2 desktops: a group runs in two rounds of about
		// 10 s. At 60 s t0 and t1 ended and t2 has one finished attempt.
		e := newBatchEnv(t, testTasks(3), flatServer(nil), realisticDesk())
		e.opts.Desktops, e.opts.Group = 2, 4
		ctx, cancel := context.WithCancel(t.Context())
		stop := time.AfterFunc(60*time.Second, cancel)
		defer stop.Stop()
		if _, err := e.collect(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Collect after SIGTERM: %v, want context.Canceled", err)
		}
		synctest.Wait()
		exported := func() (export.Stats, []string) {
			t.Helper()
			out := filepath.Join(t.TempDir(), "train.jsonl")
			st, err := export.ExportSteps(e.opts.Out, out, export.Options{AllowMissingLogprobs: true, AllowBadLogprobs: true})
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var groups []string
			for line := range strings.Lines(string(data)) {
				var s struct {
					GroupID string `json:"group_id"`
				}
				if err := json.Unmarshal([]byte(line), &s); err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(groups, s.GroupID) {
					groups = append(groups, s.GroupID)
				}
			}
			slices.Sort(groups)
			return st, groups
		}
		var ended []string
		for _, g := range e.seenGroups() {
			if len(g.Finished) > 0 {
				ended = append(ended, g.ID)
			}
		}
		slices.Sort(ended)
		st, groups := exported()
		if len(st.PartialGroups) == 0 || len(ended) == 0 {
			t.Fatalf("the stop cut short %v and ended %v: want some of each (groups with finished attempts); stop at another time", st.PartialGroups, ended)
		}
		if !slices.Equal(groups, ended) {
			t.Errorf("exported groups %v, want those the scheduler ended %v (cut short: %v)", groups, ended, st.PartialGroups)
		}
		for _, g := range st.PartialGroups {
			if slices.Contains(ended, g) {
				t.Errorf("group %s ended, but export left it out", g)
			}
		}

		e.fleet = fake.NewFleet(withTestScreen(realisticDesk()))
		e.opts.NewDesktop = e.fleet.New
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatalf("resumed Collect: %v", err)
		}
		if st, groups := exported(); len(st.PartialGroups) != 0 || len(groups) != 3 {
			t.Errorf("after the resume: exported %d groups, left out %v; want 3 and none", len(groups), st.PartialGroups)
		}
	})
}

func withTestScreen(c fake.Config) fake.Config {
	c.Width, c.Height = testWidth, testHeight
	return c
}

// TestCollectResumeFinished checks that collecting again into the directory
// of a finished batch changes nothing, creates no desktop, and delivers
// every group to OnGroup again.
func TestCollectResumeFinished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), policytest.Options{}, fake.Config{DefaultReward: fake.Reward{P: 0.5}})
		e.opts.Oversample = 1
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		first := e.seenGroups()
		file, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
		if err != nil {
			t.Fatal(err)
		}

		e.fleet = fake.NewFleet(fake.Config{})
		e.opts.NewDesktop = e.fleet.New
		e.groups = nil
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("second Collect: %v", err)
		}
		again, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(file, again) {
			t.Errorf("rollouts.jsonl changed from %d to %d bytes", len(file), len(again))
		}
		if n := len(e.fleet.Desktops()); n != 0 {
			t.Errorf("the second Collect created %d desktops, want none", n)
		}
		checkBatch(t, e, sum, true)
		byID := func(gs []Group) map[string]Group {
			m := map[string]Group{}
			for _, g := range gs {
				m[g.ID] = g
			}
			return m
		}
		if diff := cmp.Diff(byID(first), byID(e.seenGroups())); diff != "" {
			t.Errorf("groups delivered again (-first run +second run):\n%s", diff)
		}
	})
}

// TestCollectResumeRefused checks that collecting into the directory of
// another batch is refused, saying what differs and what to do, and leaves
// the directory as it was.
func TestCollectResumeRefused(t *testing.T) {
	tests := []struct {
		name   string
		change func(e *batchEnv)
		want   string
	}{
		{name: "version", change: func(e *batchEnv) { e.pol.Version = "v2" }, want: `policy version "v1", not "v2"`},
		{name: "model", change: func(e *batchEnv) { e.pol.Model = "other" }, want: `model "scripted", not "other"`},
		{name: "task list", change: func(e *batchEnv) { e.tasks = testTasks(3) }, want: "a different task list (2 tasks, not 3)"},
		{name: "task config", change: func(e *batchEnv) {
			e.tasks = testTasks(2)
			e.tasks[1].Evaluator = json.RawMessage(`{"func":"infeasible"}`)
		}, want: "the same task ids but changed task configs"},
		{name: "group", change: func(e *batchEnv) { e.opts.Group = 3 }, want: "groups of 2 with 2 attempts per task, not 3 with 3"},
		{name: "oversample", change: func(e *batchEnv) { e.opts.Oversample = 0.5 }, want: "groups of 2 with 2 attempts per task, not 2 with 3"},
		{name: "temperature", change: func(e *batchEnv) { e.pol.Temperature = new(0.7) }, want: "sampling temperature server default, top-p server default, max tokens 0, not temperature 0.7"},
		{name: "max tokens", change: func(e *batchEnv) { e.pol.MaxTokens = 512 }, want: "not temperature server default, top-p server default, max tokens 512"},
		{name: "image max", change: func(e *batchEnv) { e.opts.ImageMax = 5 }, want: "image max 20"},
		{name: "system prompt", change: func(e *batchEnv) {
			e.opts.Harness = qwen.New(qwen.Config{SystemPrompt: "You are a careful agent."})
		}, want: "system prompt built-in\", not \"qwen qwen3vl, image max 20, eviction half, pixels 4096-13107200, system prompt sha256:"},
		{name: "max steps", change: func(e *batchEnv) { e.opts.MaxSteps = 1 }, want: "--max-steps 15, not 1"},
		{name: "rollout timeout", change: func(e *batchEnv) { e.opts.RolloutTimeout = time.Minute }, want: "--rollout-timeout 0s, not 1m0s"},
		{name: "extra request fields", change: func(e *batchEnv) { e.pol.Extra = map[string]any{"top_k": 20} }, want: `extra fields {"top_k":20}`},
		{name: "family", change: func(e *batchEnv) {
			h, err := qwen.NewFamily("qwen25vl", qwen.Config{})
			if err != nil {
				panic(err)
			}
			e.opts.Harness = h
		}, want: "not \"qwen qwen25vl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newBatchEnv(t, testTasks(2), policytest.Options{}, fake.Config{})
				if _, err := e.collect(t.Context()); err != nil {
					t.Fatal(err)
				}
				file, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
				if err != nil {
					t.Fatal(err)
				}
				tt.change(e)
				_, err = e.collect(t.Context())
				if !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("Collect into another batch's directory: %v, want ErrInvalidOptions (a usage error)", err)
				}
				for _, w := range []string{tt.want, e.opts.Out, "new --out"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				again, err := os.ReadFile(filepath.Join(e.opts.Out, schema.RecordsFile))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(file, again) {
					t.Errorf("the refused Collect changed rollouts.jsonl")
				}
			})
		})
	}
}

// TestCollectResumeOlderBatchFile: a batch.json written before --max-steps
// and --rollout-timeout were recorded is continued with this run's values,
// which it then records, so a third run with other values is refused.
func TestCollectResumeOlderBatchFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.opts.Out, manifestName)
		var m map[string]any
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &m)
		}
		if err != nil {
			t.Fatal(err)
		}
		delete(m, "max_steps")
		delete(m, "rollout_timeout")
		if data, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o666); err != nil {
			t.Fatal(err)
		}
		e.opts.MaxSteps = 3
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatalf("resume of an older batch.json: %v", err)
		}
		b, err := schema.ReadBatch(e.opts.Out)
		if err != nil || b.MaxSteps != 3 || b.RolloutTimeout != "0s" {
			t.Fatalf("batch.json after the resume: %+v, %v; want max steps 3 and rollout timeout 0s recorded", b, err)
		}
		e.opts.MaxSteps = 4
		if _, err := e.collect(t.Context()); err == nil || !strings.Contains(err.Error(), "--max-steps 3, not 4") {
			t.Errorf("third run with another --max-steps: %v, want a refusal", err)
		}
	})
}

// TestCollectResumeRepairs: a resume moves a damaged line and a second
// final record of an attempt to the quarantine file, as legato rl repair
// does, and keeps the first; the batch goes on and exports.
func TestCollectResumeRepairs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.opts.Out, schema.RecordsFile)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(string(data), "\n")
		var final string
		for _, l := range lines {
			if strings.Contains(l, `"status":"ok"`) {
				final = l
				break
			}
		}
		dup := strings.Replace(final, `"rollout_id":"`, `"rollout_id":"again-`, 1)
		damaged := append([]byte(nil), data...)
		damaged = append(damaged, "{\"schema\":\"legato.rollout/v0\",\"rollo\n"...)
		damaged = append(damaged, dup...)
		if err := os.WriteFile(path, damaged, 0o666); err != nil {
			t.Fatal(err)
		}
		n := len(lines) - 1 // lines ends with "" after the last newline

		if _, err := e.collect(t.Context()); err != nil {
			t.Fatalf("resume of a damaged run: %v", err)
		}
		again, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, data) {
			t.Errorf("rollouts.jsonl after the resume differs from before the damage")
		}
		q, err := os.ReadFile(filepath.Join(e.opts.Out, schema.QuarantineFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{fmt.Sprintf(`"line":%d`, n+1), fmt.Sprintf(`"line":%d`, n+2), "two final records"} {
			if !strings.Contains(string(q), w) {
				t.Errorf("quarantine file does not say %s:\n%s", w, q)
			}
		}
		if _, err := export.ExportSteps(e.opts.Out, filepath.Join(t.TempDir(), "train.jsonl"), export.Options{AllowMissingLogprobs: true}); err != nil {
			t.Errorf("export after the resume: %v", err)
		}
	})
}

// TestCollectResumeForeignRecords checks that a directory with records but
// no batch description is not taken for a batch.
func TestCollectResumeForeignRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(e.opts.Out, manifestName)); err != nil {
			t.Fatal(err)
		}
		_, err := e.collect(t.Context())
		if err == nil || !strings.Contains(err.Error(), "new --out") {
			t.Errorf("Collect into records without %s: %v, want a refusal", manifestName, err)
		}
	})
}

func TestCollectOptionsValidate(t *testing.T) {
	ok := CollectOptions{Out: "dir", NewDesktop: fake.NewFleet(fake.Config{}).New}
	tests := []struct {
		name   string
		change func(o *CollectOptions)
		want   string // a substring of the error; "" for valid options
	}{
		{name: "valid", change: func(*CollectOptions) {}},
		{name: "no out", change: func(o *CollectOptions) { o.Out = "" }, want: "--out DIR"},
		{name: "no desktops", change: func(o *CollectOptions) { o.NewDesktop = nil }, want: "CollectOptions.NewDesktop"},
		{name: "negative oversample", change: func(o *CollectOptions) { o.Oversample = -1 }, want: "--oversample) -1"},
		{name: "NaN oversample", change: func(o *CollectOptions) { o.Oversample = math.NaN() }, want: "--oversample) NaN"},
		{name: "huge oversample", change: func(o *CollectOptions) { o.Oversample = 1e300 }, want: "want 0 to 8"},
		{name: "negative timeout", change: func(o *CollectOptions) { o.RolloutTimeout = -time.Second }, want: "--rollout-timeout) -1s"},
		{name: "100ns rollout timeout", change: func(o *CollectOptions) { o.RolloutTimeout = 100 }, want: "--rollout-timeout) 100ns: want 0 (no cap) or at least 1s"},
		{name: "1s rollout timeout", change: func(o *CollectOptions) { o.RolloutTimeout = time.Second }},
		{name: "negative server-down timeout", change: func(o *CollectOptions) { o.ServerDownTimeout = -time.Second }, want: "--server-down-timeout) -1s"},
		{name: "negative group", change: func(o *CollectOptions) { o.Group = -3 }, want: "Group (--group) -3: want 0 to 1024"},
		{name: "huge group", change: func(o *CollectOptions) { o.Group = 1000000 }, want: "Group (--group) 1000000"},
		{name: "negative desktops", change: func(o *CollectOptions) { o.Desktops = -2 }, want: "Desktops (--desktops) -2"},
		{name: "negative max steps", change: func(o *CollectOptions) { o.MaxSteps = -1 }, want: "MaxSteps (--max-steps) -1"},
		{name: "negative image max", change: func(o *CollectOptions) { o.ImageMax = -1 }, want: "ImageMax (--image-max) -1"},
		{name: "one stable screenshot", change: func(o *CollectOptions) { o.Ready.Stable = 1 }, want: "ready stable 1"},
		{name: "sample std", change: func(o *CollectOptions) { o.AdvantageStd = schema.SampleStd }},
		{name: "unknown std", change: func(o *CollectOptions) { o.AdvantageStd = "unbiased" }, want: `AdvantageStd (--advantage-std) "unbiased": want population or sample`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.change(&o)
			err := o.withDefaults().Validate()
			if (err == nil) != (tt.want == "") || (err != nil && (!strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidOptions))) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestAttemptsPerTask(t *testing.T) {
	tests := []struct {
		group      int
		oversample float64
		want       int
	}{
		{4, 0, 4}, {4, 0.25, 5}, {8, 0.25, 10}, {4, 0.3, 6}, {3, 1, 6}, {1, 0.01, 2}, {10, 0.1, 11}, {10, 0.3, 13},
	}
	for _, tt := range tests {
		if got := AttemptsPerTask(tt.group, tt.oversample); got != tt.want {
			t.Errorf("AttemptsPerTask(%d, %v) = %d, want %d", tt.group, tt.oversample, got, tt.want)
		}
	}
}

// TestCollectCancelKeepsGraded checks that an attempt graded when Ctrl-C
// comes is kept: its grading returned, so it is finished work.
func TestCollectCancelKeepsGraded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1)}, fake.Config{DefaultReward: fake.Reward{P: 1}})
		e.opts.Desktops = 1
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		newDesktop := e.opts.NewDesktop
		e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := newDesktop(ctx, slot)
			return cancelOnEvaluate{d, cancel}, err
		}
		if _, err := e.collect(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Collect: %v, want context.Canceled", err)
		}
		recs := readRecords(t, e.opts.Out)
		if len(recs) != 1 || recs[0].Status != StatusOK || recs[0].Reward == nil {
			t.Fatalf("records %+v: want the graded attempt, ok", recs)
		}
		e.opts.NewDesktop = newDesktop
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := checkBatch(t, e, sum, true); len(got) != 2 {
			t.Errorf("%d records after resume, want 2", len(got))
		}
	})
}

// cancelOnEvaluate cancels the batch while the attempt is graded.
type cancelOnEvaluate struct {
	desktop.Desktop
	cancel context.CancelFunc
}

func (d cancelOnEvaluate) Evaluate(ctx context.Context, task Task) (float64, error) {
	r, err := d.Desktop.Evaluate(ctx, task)
	d.cancel()
	return r, err
}

// TestCollectStoreFailure checks that a batch whose run store fails stops
// at once with the store's error, closes its desktops, and can be resumed
// once the directory is usable again.
func TestCollectStoreFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), policytest.Options{Script: clicksThenDone(2)}, fake.Config{})
		newDesktop := e.opts.NewDesktop
		var once sync.Once
		e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := newDesktop(ctx, slot)
			return breakStoreOnObserve{d, func() {
				once.Do(func() {
					for _, sub := range []string{schema.MessagesDir, schema.ImagesDir} {
						if err := os.RemoveAll(filepath.Join(e.opts.Out, sub)); err != nil {
							t.Error(err)
						}
					}
				})
			}}, err
		}
		_, err := e.collect(t.Context())
		if err == nil || errors.Is(err, ErrBatchIncomplete) {
			t.Fatalf("Collect with a broken store: %v, want the store's error", err)
		}
		t.Logf("Collect: %v", err)
		checkClosed(t, e.fleet)
		if recs := readRecords(t, e.opts.Out); len(recs) != 0 {
			t.Errorf("%d records written by a batch whose store failed on its first step", len(recs))
		}

		e.opts.NewDesktop = newDesktop
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("resumed Collect: %v", err)
		}
		checkBatch(t, e, sum, true)
	})
}

// breakStoreOnObserve calls brk before each screenshot.
type breakStoreOnObserve struct {
	desktop.Desktop
	brk func()
}

func (d breakStoreOnObserve) Observe(ctx context.Context) (desktop.Observation, error) {
	d.brk()
	return d.Desktop.Observe(ctx)
}

// TestCollectResumeKeepsEarlierRuns: a resumed batch's summary adds the
// outages of the earlier runs, which only their summary.json knew, and lists
// their stops: one that stopped (written before summaries listed stops)
// and one that was killed (its summary still said running). A third run
// counts nothing twice.
func TestCollectResumeKeepsEarlierRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(2), policytest.Options{}, fake.Config{})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.opts.Out, schema.SummaryFile)
		edit := func(change func(s *schema.Summary)) {
			t.Helper()
			s, err := schema.ReadSummary(e.opts.Out)
			if err != nil {
				t.Fatal(err)
			}
			change(s)
			data, err := json.Marshal(s)
			if err == nil {
				err = os.WriteFile(path, data, 0o666)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		edit(func(s *schema.Summary) {
			s.ServerDownS, s.Outages = 12.5, 2
			s.State, s.StopReason, s.Stops = schema.StateStopped, "write record: no space left on device", nil
		})
		if _, err := e.collect(t.Context()); err != nil {
			t.Fatal(err)
		}
		edit(func(s *schema.Summary) { s.Final, s.State = false, schema.StateRunning })
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*schema.Summary{sum, readSummaryFile(t, e.opts.Out)} {
			if s.ServerDownS != 12.5 || s.Outages != 2 {
				t.Errorf("summary: server_down_s %v, outages %d; want the earlier runs' 12.5 and 2", s.ServerDownS, s.Outages)
			}
			want := []schema.Stop{
				{State: schema.StateStopped, Reason: "write record: no space left on device"},
				{State: schema.StateRunning, Reason: "the run ended without its final summary (killed or crashed)"},
			}
			if diff := cmp.Diff(want, s.Stops); diff != "" {
				t.Errorf("stops (-want +got):\n%s", diff)
			}
		}
	})
}

func readSummaryFile(t *testing.T, dir string) *schema.Summary {
	t.Helper()
	s, err := schema.ReadSummary(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
