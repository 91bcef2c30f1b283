package rl

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// killChildEnv switches the test binary into the child of TestCollectKill9:
// it holds the run directory to collect into.
const killChildEnv = "LEGATO_TEST_KILL_CHILD_DIR"

const (
	killTasks      = 8
	killGroup      = 3
	killOversample = 0.5
)

// runKillBatch runs the batch of TestCollectKill9 into dir, with real time:
// small latencies, and a desktop failure on one reset in ten so that
// retried tries are cut by kills too.
func runKillBatch(ctx context.Context, dir string) (*Summary, error) {
	srv := policytest.NewPipeServer(policytest.Options{
		Script:  policytest.DefaultScript,
		Latency: policytest.Latency{Base: 20 * time.Millisecond, PerToken: 100 * time.Microsecond},
	})
	defer srv.Close()
	fleet := fake.NewFleet(fake.Config{
		Width: testWidth, Height: testHeight,
		Latency: fake.Latencies{
			Reset:    fake.Latency{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
			Observe:  fake.Latency{Fixed: 2 * time.Millisecond},
			Act:      fake.Latency{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond},
			Settle:   fake.Latency{Max: 30 * time.Millisecond},
			Evaluate: fake.Latency{Min: 5 * time.Millisecond, Max: 40 * time.Millisecond},
		},
		DefaultReward: fake.Reward{P: 0.5},
		Faults:        []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, Prob: 0.1}},
	})
	return Collect(ctx, testTasks(killTasks), PolicyConfig{
		BaseURL: srv.URL(), Model: "scripted", Version: "v1", StepTimeout: 10 * time.Second,
		HTTPClient: srv.Client(),
	}, CollectOptions{
		Out: dir, NewDesktop: fleet.New, Desktops: 4, Group: killGroup, Oversample: killOversample,
		EnvRetries: 8, MaxSteps: 6,
		// The resets fail at random (one in ten): a task whose first
		// resets all failed on 3 desktops would be quarantined and its
		// group never close, which is not what this test is about.
		QuarantineSetupFails: 1 << 20,
		Ready:                desktop.ReadyOptions{Interval: 10 * time.Millisecond, Max: time.Second},
		SummaryInterval:      100 * time.Millisecond,
	})
}

// TestCollectKillChild is the child process of TestCollectKill9; it does
// nothing in a normal test run.
func TestCollectKillChild(t *testing.T) {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		t.Skip("the child of TestCollectKill9")
	}
	if _, err := runKillBatch(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
}

// TestCollectKill9 kills a batch with SIGKILL at random points, several
// times, and then runs it to the end in the same directory. After every
// kill the records written before it are still there, unchanged; at the
// end every attempt has exactly one final record, every group exactly G
// finished attempts, and no rollout id appears twice.
func TestCollectKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	dir := filepath.Join(t.TempDir(), "run")
	var kept []byte // complete lines of rollouts.jsonl so far
	kills := 0
	for i := range 5 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCollectKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(200+r.IntN(2500)) * time.Millisecond
		killer := time.AfterFunc(delay, func() { _ = cmd.Process.Kill() })
		err := cmd.Wait()
		killer.Stop()
		var exit *exec.ExitError
		switch {
		case err == nil:
			t.Logf("child %d finished the batch before its kill at %v", i, delay)
		case errors.As(err, &exit) && !exit.Exited():
			kills++
		default:
			t.Fatalf("child %d: %v\n%s", i, err, out.Bytes())
		}
		data, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
		if errors.Is(err, os.ErrNotExist) {
			continue // killed before it created the directory
		}
		if err != nil {
			t.Fatal(err)
		}
		// Whatever the kill cut is after the last newline; the next run
		// drops it. Everything before was written by Appends that
		// returned, and must survive every later run.
		if !bytes.HasPrefix(data, kept) {
			t.Fatalf("after child %d, rollouts.jsonl no longer starts with the %d bytes of records written before", i, len(kept))
		}
		kept = data[:bytes.LastIndexByte(data, '\n')+1]
		t.Logf("child %d killed after %v: %d bytes of records", i, delay, len(kept))
	}
	if kills == 0 {
		t.Fatal("no child was killed; the kill delays are too long")
	}

	if _, err := runKillBatch(t.Context(), dir); err != nil {
		t.Fatalf("final run: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, schema.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, kept) {
		t.Fatalf("the final run changed the records of the killed ones")
	}
	recs := readRecords(t, dir)
	tasks := testTasks(killTasks)
	perTask := AttemptsPerTask(killGroup, killOversample)
	final := finalRecords(t, recs, tasks, "v1", perTask)
	ids := map[string]bool{}
	for _, r := range recs {
		checkTiming(t, r.RolloutID, r) // in real time here
		if ids[r.RolloutID] {
			t.Errorf("rollout id %s appears twice", r.RolloutID)
		}
		ids[r.RolloutID] = true
	}
	finished := map[string]int{}
	for _, r := range final {
		if r.Status.Finished() {
			finished[r.GroupID]++
		}
		if r.Status == StatusError {
			t.Errorf("attempt %s a%d ended in error: %+v", r.GroupID, r.Attempt, r.Error)
		}
	}
	for _, task := range tasks {
		if gid := groupID("v1", task.ID); finished[gid] != killGroup {
			t.Errorf("group %s has %d finished attempts, want %d", gid, finished[gid], killGroup)
		}
	}
	sum, err := schema.ReadSummary(dir)
	if err != nil || !sum.Final || sum.Records != len(recs) || sum.GroupsClosed != killTasks {
		t.Errorf("summary.json %+v (%v): want final, %d records, %d closed groups", sum, err, len(recs), killTasks)
	}
	t.Logf("%d kills, %d records in the end: %v", kills, len(recs), statusCounts(recs))
}
