package rl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
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
	"legato/rl/schema"
)

// Most tests of Collect run in a testing/synctest bubble: the fake desktops
// and the scripted server wait on the bubble's clock, so latencies of
// seconds cost nothing and timings in the records are exact.

// testWidth × testHeight is a screen Qwen3-VL's smart resize keeps as it is
// (both sides multiples of 32), so the harness sends the fake's PNGs without
// scaling them and the tests spend no CPU on images.
const testWidth, testHeight = 320, 192

// testTasks returns n feasible tasks named t0, t1, ...
func testTasks(n int) []Task {
	var ts []Task
	for i := range n {
		ts = append(ts, Task{
			ID:          fmt.Sprintf("t%d", i),
			Domain:      "os",
			Instruction: fmt.Sprintf("do thing number %d", i),
			Evaluator:   json.RawMessage(`{"func":"exact_match"}`),
		})
	}
	return ts
}

// reply is a scripted model reply: one computer_use call with args.
func reply(args string) string {
	return "Action: next.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": " + args + "}\n</tool_call>"
}

const (
	clickArgs = `{"action": "left_click", "coordinate": [500, 500]}`
	doneArgs  = `{"action": "terminate", "status": "success"}`
)

// clicksThenDone clicks on n steps, then ends the attempt.
func clicksThenDone(n int) func(policytest.Request) string {
	return func(req policytest.Request) string {
		if req.Step < n {
			return reply(clickArgs)
		}
		return reply(doneArgs)
	}
}

// neverDone clicks forever.
func neverDone(policytest.Request) string { return reply(clickArgs) }

// batchEnv is a batch against a fleet of fake desktops and a scripted
// server on an in-memory pipe. Create it inside a synctest bubble.
type batchEnv struct {
	srv   *policytest.Server
	fleet *fake.Fleet
	tasks []Task
	pol   PolicyConfig
	opts  CollectOptions

	mu     sync.Mutex
	groups []Group // as OnGroup saw them
}

func newBatchEnv(t *testing.T, tasks []Task, srvOpts policytest.Options, deskCfg fake.Config) *batchEnv {
	t.Helper()
	if srvOpts.Latency == (policytest.Latency{}) {
		srvOpts.NoLatency = true
	}
	srv := policytest.NewPipeServer(srvOpts)
	t.Cleanup(srv.Close)
	if deskCfg.Width == 0 {
		deskCfg.Width, deskCfg.Height = testWidth, testHeight
	}
	fleet := fake.NewFleet(deskCfg)
	e := &batchEnv{
		srv:   srv,
		fleet: fleet,
		tasks: tasks,
		pol: PolicyConfig{
			BaseURL: srv.URL(), Model: "scripted", Version: "v1",
			StepTimeout: 30 * time.Second, Retries: 1,
			HTTPClient: srv.Client(),
		},
		opts: CollectOptions{
			Out:        filepath.Join(t.TempDir(), "run"),
			NewDesktop: fleet.New,
			Desktops:   2,
			Group:      2,
			Ready:      desktop.ReadyOptions{Interval: 100 * time.Millisecond, Max: 5 * time.Second},
		},
	}
	e.opts.OnGroup = func(g Group) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.groups = append(e.groups, g)
	}
	return e
}

func (e *batchEnv) collect(ctx context.Context) (*Summary, error) {
	return Collect(ctx, e.tasks, e.pol, e.opts)
}

// seenGroups returns the groups OnGroup was called with so far.
func (e *batchEnv) seenGroups() []Group {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.groups)
}

func readRecords(t *testing.T, dir string) []schema.Record {
	t.Helper()
	var recs []schema.Record
	stats, err := schema.ReadRunRecords(dir, func(r schema.Record) error {
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.TornLines > 0 {
		t.Errorf("rollouts.jsonl has %d torn lines after a clean end", stats.TornLines)
	}
	return recs
}

func statusCounts(recs []schema.Record) map[Status]int {
	m := map[Status]int{}
	for _, r := range recs {
		m[r.Status]++
	}
	return m
}

// attemptKey names an attempt across its tries.
type attemptKey struct {
	group   string
	attempt int
}

// finalRecords returns the last record of each attempt that is not
// retried, failing the test when an attempt of the batch has none, or
// several where the earlier ones are not errors a resume ran again.
func finalRecords(t *testing.T, recs []schema.Record, tasks []Task, version string, perTask int) map[attemptKey]schema.Record {
	t.Helper()
	final := map[attemptKey]schema.Record{}
	for _, r := range recs {
		if r.Status == StatusRetried {
			continue
		}
		k := attemptKey{r.GroupID, r.Attempt}
		if old, ok := final[k]; ok && old.Status != StatusError {
			t.Errorf("attempt %v has two final records: %s (%s) and %s (%s)", k, old.RolloutID, old.Status, r.RolloutID, r.Status)
		}
		final[k] = r
	}
	for _, task := range tasks {
		for a := range perTask {
			k := attemptKey{groupID(version, task.ID), a}
			if _, ok := final[k]; !ok {
				t.Errorf("attempt %v has no final record", k)
			}
		}
	}
	if want := len(tasks) * perTask; len(final) != want {
		t.Errorf("%d attempts have a final record, want %d", len(final), want)
	}
	return final
}

// checkBatch checks what must hold of every batch that ran to its end, and
// of the part of a batch that was stopped (complete false):
//   - each record is well formed: reward exactly on graded records, in
//     [0, 1]; an error on error and retried records only; phase times ≥ 0
//     adding up to no more than total_s; unique rollout ids;
//   - each attempt has at most one final record, after all its retried
//     ones (with complete, exactly one), and no more retries than allowed;
//     an error record may be followed by another try (a resume reran it),
//     no more often than ErrorReruns;
//   - a group has at most G finished records; cancelled, skipped and
//     surplus records only in groups that closed;
//   - OnGroup saw each group at most once (with complete, exactly once),
//     with the file's finished records of the group and their advantages;
//   - the summary counts the file's records.
func checkBatch(t *testing.T, e *batchEnv, sum *Summary, complete bool) []schema.Record {
	t.Helper()
	opts := e.opts.withDefaults()
	perTask := AttemptsPerTask(opts.Group, opts.Oversample)
	recs := readRecords(t, e.opts.Out)
	ids := map[string]bool{}
	tries := map[attemptKey]int{}
	reruns := map[attemptKey]int{}
	final := map[attemptKey]schema.Record{}
	finished := map[string][]schema.Record{}
	for _, r := range recs {
		name := fmt.Sprintf("record %s (%s a%d, %s)", r.RolloutID, r.GroupID, r.Attempt, r.Status)
		if ids[r.RolloutID] {
			t.Errorf("%s: duplicate rollout id", name)
		}
		ids[r.RolloutID] = true
		if r.Policy.Version != e.pol.Version || r.Schema != schema.Version {
			t.Errorf("%s: policy %+v schema %q", name, r.Policy, r.Schema)
		}
		if r.Attempt < 0 || r.Attempt >= perTask {
			t.Errorf("%s: attempt out of [0, %d)", name, perTask)
		}
		switch graded := r.Status.Graded(); {
		case graded && r.Reward == nil:
			t.Errorf("%s: graded without a reward", name)
		case graded && (*r.Reward < 0 || *r.Reward > 1):
			t.Errorf("%s: reward %v out of [0, 1]", name, *r.Reward)
		case !graded && r.Reward != nil:
			t.Errorf("%s: reward %v on an attempt that was not graded", name, *r.Reward)
		}
		switch r.Status {
		case StatusError, StatusRetried:
			if r.Error == nil || (r.Error.Kind != schema.ErrorEnv && r.Error.Kind != schema.ErrorPolicy) || r.Error.Message == "" {
				t.Errorf("%s: error %+v, want a kind and a message", name, r.Error)
			}
			if r.Status == StatusRetried && r.Error != nil && r.Error.Kind != schema.ErrorEnv {
				t.Errorf("%s: retried for a %s error, want env", name, r.Error.Kind)
			}
		default:
			if r.Error != nil {
				t.Errorf("%s: error %+v on a record that did not fail", name, r.Error)
			}
		}
		if r.NSteps != len(r.Steps) || r.NSteps > opts.MaxSteps {
			t.Errorf("%s: n_steps %d, %d steps, max %d", name, r.NSteps, len(r.Steps), opts.MaxSteps)
		}
		checkTiming(t, name, r)
		k := attemptKey{r.GroupID, r.Attempt}
		if old, ok := final[k]; ok && old.Status == StatusError {
			// A try after an error record: a resume ran it again.
			delete(final, k)
			tries[k] = 0
			reruns[k]++
			if reruns[k] > opts.ErrorReruns {
				t.Errorf("%s: rerun %d of the attempt after an error, more than the %d allowed", name, reruns[k], opts.ErrorReruns)
			}
		}
		if r.Status == StatusRetried {
			if _, ok := final[k]; ok {
				t.Errorf("%s: a retry after the attempt's final record", name)
			}
			tries[k]++
			if tries[k] > opts.EnvRetries {
				t.Errorf("%s: retry %d, more than the %d allowed", name, tries[k], opts.EnvRetries)
			}
			continue
		}
		if old, ok := final[k]; ok {
			t.Errorf("%s: second final record of the attempt, after %s (%s)", name, old.RolloutID, old.Status)
		}
		final[k] = r
		if r.Status.Finished() {
			finished[r.GroupID] = append(finished[r.GroupID], r)
		}
	}
	closed := map[string]bool{}
	for _, task := range e.tasks {
		gid := groupID(e.pol.Version, task.ID)
		n := len(finished[gid])
		if n > opts.Group {
			t.Errorf("group %s: %d finished records, more than G = %d", gid, n, opts.Group)
		}
		closed[gid] = n >= opts.Group
		errs := 0
		for a := range perTask {
			r, ok := final[attemptKey{gid, a}]
			switch {
			case !ok && complete:
				t.Errorf("group %s attempt %d: no final record", gid, a)
			case !ok:
			case r.Status == StatusCancelled || r.Status == StatusSkipped || r.Status == StatusSurplus:
				if !closed[gid] {
					t.Errorf("group %s attempt %d: %s in a group that did not close (%d finished)", gid, a, r.Status, n)
				}
			case r.Status == StatusError:
				errs++
			}
		}
		if complete && !closed[gid] && n+errs != perTask {
			t.Errorf("group %s did not close: %d finished, %d errors of %d attempts", gid, n, errs, perTask)
		}
	}
	if len(final) > len(e.tasks)*perTask {
		t.Errorf("%d final records for %d attempts", len(final), len(e.tasks)*perTask)
	}

	// OnGroup.
	seen := map[string]bool{}
	for _, g := range e.seenGroups() {
		if seen[g.ID] {
			t.Errorf("OnGroup called twice for group %s", g.ID)
		}
		seen[g.ID] = true
		if g.Closed != closed[g.ID] {
			t.Errorf("OnGroup: group %s Closed = %v, the file says %v", g.ID, g.Closed, closed[g.ID])
		}
		var want, got []string
		var rewards []float64
		for _, r := range finished[g.ID] {
			want = append(want, r.RolloutID)
		}
		for _, r := range g.Finished {
			got = append(got, r.RolloutID)
			rewards = append(rewards, *r.Reward)
		}
		sort.Strings(want)
		sort.Strings(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("OnGroup: group %s finished records (-file +OnGroup):\n%s", g.ID, diff)
		}
		if diff := cmp.Diff(export.Advantages(rewards, e.opts.AdvantageStd), g.Advantages); diff != "" {
			t.Errorf("OnGroup: group %s advantages (-want +got):\n%s", g.ID, diff)
		}
		if !strings.HasSuffix(g.ID, "/"+g.TaskID) {
			t.Errorf("OnGroup: group %s of task %s", g.ID, g.TaskID)
		}
	}
	if complete {
		for _, task := range e.tasks {
			if gid := groupID(e.pol.Version, task.ID); !seen[gid] {
				t.Errorf("OnGroup never called for group %s", gid)
			}
		}
	}

	// Summary.
	if sum != nil {
		counts := statusCounts(recs)
		for s, n := range sum.Counts {
			if counts[s] != n {
				t.Errorf("summary counts %d %s records, the file has %d", n, s, counts[s])
			}
		}
		if sum.Records != len(recs) || !sum.Final {
			t.Errorf("summary: %d records, final %v; the file has %d", sum.Records, sum.Final, len(recs))
		}
		onDisk, err := schema.ReadSummary(e.opts.Out)
		if err != nil {
			t.Errorf("summary.json: %v", err)
		} else if diff := cmp.Diff(sum, onDisk); diff != "" {
			t.Errorf("summary.json differs from the returned summary (-returned +file):\n%s", diff)
		}
	}
	return recs
}

// checkTiming checks that the phases of r are not negative and add up to no
// more than total_s.
func checkTiming(t *testing.T, name string, r schema.Record) {
	t.Helper()
	tm := r.Timing
	phases := []float64{tm.ResetS, tm.WaitAfterResetS, tm.QueueS, tm.ModelS, tm.ActS, tm.WaitS, tm.ObsS, tm.WaitBeforeEvalS, tm.EvalS}
	sum := 0.0
	for _, p := range phases {
		if p < 0 || math.IsNaN(p) {
			t.Errorf("%s: negative phase time in %+v", name, tm)
		}
		sum += p
	}
	// A microsecond of slack for float rounding.
	if sum > tm.TotalS+1e-6 {
		t.Errorf("%s: phases add up to %.6f s, more than total_s %.6f: %+v", name, sum, tm.TotalS, tm)
	}
	if d := r.EndedAt.Sub(r.StartedAt.Time).Seconds(); tm.TotalS > d+0.002 {
		// Timestamps are written with milliseconds.
		t.Errorf("%s: total_s %.3f, but it ran from %v to %v", name, tm.TotalS, r.StartedAt, r.EndedAt)
	}
}

// checkClosed fails the test unless every desktop the fleet made was closed.
func checkClosed(t *testing.T, fleet *fake.Fleet) {
	t.Helper()
	for _, d := range fleet.Desktops() {
		if d.Stats().Closes == 0 {
			t.Errorf("desktop %s was never closed", d.Name())
		}
	}
}

func TestCollectSmoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), flatServer(nil), withTestScreen(realisticDesk()))
		var progress []Progress
		e.opts.Progress = func(p Progress) { progress = append(progress, p) }
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 6}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		// Progress every 2 s of the batch, and once at the end.
		if len(progress) < 3 {
			t.Fatalf("%d progress reports, want one every 2 s and a final one", len(progress))
		}
		last := progress[len(progress)-1]
		if !last.Final || last.GroupsEnded != 3 || last.GroupsClosed != 3 || last.Counts[StatusOK] != 6 || last.Running != 0 || last.RolloutsPerHour <= 0 {
			t.Errorf("final progress %+v: want final, 3 groups ended and closed, 6 ok, none running", last)
		}
		for i, p := range progress[:len(progress)-1] {
			if p.Final || p.Elapsed != time.Duration(i+1)*DefaultProgressInterval {
				t.Errorf("progress %d: %+v, want not final at %v", i, p, time.Duration(i+1)*DefaultProgressInterval)
			}
		}
		if sum.GroupsClosed != 3 || sum.ModelCalls == 0 || sum.StepsWithTokenIDs != 1 {
			t.Errorf("summary %+v: want 3 closed groups, model calls, token ids on every step", sum)
		}
		checkClosed(t, e.fleet)
	})
}

// errorsIs reports whether err matches target; a nil target wants nil.
func errorsIs(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}

var _ desktop.Factory = (*fake.Fleet)(nil).New

// TestCollectSlowOnGroup checks that a slow OnGroup delays no desktop, and
// that Collect returns only after its last call returned.
func TestCollectSlowOnGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(4), flatServer(nil), withTestScreen(realisticDesk()))
		onGroup := e.opts.OnGroup
		e.opts.OnGroup = func(g Group) {
			time.Sleep(10 * time.Minute) // a trainer step
			onGroup(g)
		}
		start := time.Now()
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < 40*time.Minute {
			t.Errorf("Collect returned after %v, before the 4 OnGroup calls of 10 min ended", got)
		}
		recs := checkBatch(t, e, sum, true)
		var last time.Time
		for _, r := range recs {
			if r.EndedAt.After(last) {
				last = r.EndedAt.Time
			}
		}
		if d := last.Sub(start); d > 5*time.Minute {
			t.Errorf("the last attempt ended %v after the start: OnGroup held up the desktops", d)
		}
	})
}

// TestCollectLoopback runs a batch in real time against the scripted server
// on a loopback port, through the policy client's own HTTP transport, whose
// connections Collect must close (goleak checks in TestMain).
func TestCollectLoopback(t *testing.T) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
	out := filepath.Join(t.TempDir(), "run")
	_, err := Collect(t.Context(), testTasks(2), PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1"},
		CollectOptions{Out: out, NewDesktop: fleet.New, Desktops: 2, Group: 2,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, out)
	if diff := cmp.Diff(map[Status]int{StatusOK: 4}, statusCounts(recs)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	for _, r := range recs {
		checkTiming(t, r.RolloutID, r) // in real time here
	}
	checkClosed(t, fleet)
}
