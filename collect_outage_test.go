package rl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// switchable is the way to a model server that a test can take down: while
// down, every request fails as a stopped server's does, with the
// connection refused.
type switchable struct {
	next  http.RoundTripper
	down  atomic.Bool
	tried atomic.Int64 // requests while down
}

func (s *switchable) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.down.Load() {
		s.tried.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return s.next.RoundTrip(r)
}

// withSwitch routes the env's policy calls through a switchable.
func withSwitch(e *batchEnv) *switchable {
	sw := &switchable{next: e.srv.Client().Transport}
	e.pol.HTTPClient = &http.Client{Transport: sw}
	return sw
}

// TestCollectRidesThroughOutage: the model server stops for 60 s in the
// middle of a batch and comes back; every group completes, no record is an
// error, and the time paused is recorded in the steps, the records and the
// summary.
func TestCollectRidesThroughOutage(t *testing.T) {
	for _, replicas := range [][]string{nil, {"http://second-replica.pipe/v1"}} {
		t.Run(fmt.Sprintf("%d replicas", 1+len(replicas)), func(t *testing.T) { ridesThroughOutage(t, replicas) })
	}
}

// ridesThroughOutage takes every replica down at once (the pipe reaches
// the same server whatever the URL's host).
func ridesThroughOutage(t *testing.T, replicas []string) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(4), policytest.Options{Script: clicksThenDone(3)},
			fake.Config{Latency: fake.Latencies{Act: fake.Latency{Fixed: time.Second}}, DefaultReward: fake.Reward{P: 0.5}})
		e.opts.Desktops = 3
		e.opts.RolloutTimeout = 10 * time.Second // the outage must not truncate
		e.pol.Replicas = replicas
		sw := withSwitch(e)
		const downAt, downFor = 2500 * time.Millisecond, 60 * time.Second
		stop := time.AfterFunc(downAt, func() {
			sw.down.Store(true)
			time.AfterFunc(downFor, func() { sw.down.Store(false) })
		})
		defer stop.Stop()

		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("Collect: %v", err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 8}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		if sw.tried.Load() == 0 {
			t.Fatal("no request was made while the server was down: the test tested nothing")
		}
		var paused, stepPaused float64
		for _, r := range recs {
			paused += r.Timing.ServerDownS
			for _, s := range r.Steps {
				stepPaused += s.ServerDownS
			}
			if r.Timing.ModelS > 10 {
				t.Errorf("%s: model_s %v counts the outage", r.RolloutID, r.Timing.ModelS)
			}
		}
		// The calls the outage cut were sent again after it: their steps
		// count every send, and retried_calls counts those steps.
		if sum.RetriedCalls == 0 {
			t.Error("retried_calls is 0: the resends after the outage were not counted")
		}
		if paused == 0 || paused != stepPaused {
			t.Errorf("records paused %v s, their steps %v s: want the same, above 0", paused, stepPaused)
		}
		// The server was away 60 s; the breaker's pings find it back
		// within one backoff (policy.MaxProbeInterval, for the breaker's
		// prober and the replicas' alike).
		if sum.ServerDownS < 55 || sum.ServerDownS > 60+policy.MaxProbeInterval.Seconds()+1 || sum.State != schema.StateComplete {
			t.Errorf("summary: server down %v s, state %q; want about 60 s, complete", sum.ServerDownS, sum.State)
		}
	})
}

// TestCollectStopsWhenServerStaysDown: past --server-down-timeout the batch
// stops cleanly, with ErrServerDown and no error record; collecting again
// once the server is back completes it.
func TestCollectStopsWhenServerStaysDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(3), policytest.Options{Script: clicksThenDone(2)}, fake.Config{})
		e.opts.ServerDownTimeout = 3 * time.Minute
		sw := withSwitch(e)
		sw.down.Store(true)
		start := time.Now()
		sum, err := e.collect(t.Context())
		if !errors.Is(err, ErrServerDown) || !strings.Contains(err.Error(), "--server-down-timeout") {
			t.Fatalf("Collect: %v; want ErrServerDown naming --server-down-timeout", err)
		}
		if took := time.Since(start); took < 3*time.Minute || took > 3*time.Minute+15*time.Second {
			t.Errorf("the batch stopped after %v, want soon after the 3 min limit", took)
		}
		if recs := readRecords(t, e.opts.Out); len(recs) != 0 {
			t.Errorf("%d records, want none: an outage is not the attempts' failure", len(recs))
		}
		if sum.State != schema.StateStopped || !strings.Contains(sum.StopReason, "model server down") {
			t.Errorf("summary state %q, reason %q; want stopped, saying the server was down", sum.State, sum.StopReason)
		}
		checkClosed(t, e.fleet)

		sw.down.Store(false)
		e.fleet = fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
		e.opts.NewDesktop = e.fleet.New
		sum, err = e.collect(t.Context())
		if err != nil {
			t.Fatalf("resumed Collect: %v", err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 6}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses after resume (-want +got):\n%s", diff)
		}
	})
}

// TestCollectResendsAfterOneLostCall: a call whose tries all failed while
// the server then answers the first ping is sent again, so a server that
// drops a connection now and then costs no attempt.
func TestCollectResendsAfterOneLostCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		e := newBatchEnv(t, testTasks(2), policytest.Options{Script: clicksThenDone(2),
			Faults: func(_ int, r policytest.Request) policytest.Fault {
				// Every third step request dies mid-answer (the
				// breaker's probes are served: the server serves).
				if !isProbe(r) && n.Add(1)%3 == 0 {
					return policytest.FaultTruncatedBody
				}
				return policytest.NoFault
			}}, fake.Config{})
		e.pol.Retries = 0
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("Collect: %v", err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 4}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		if n.Load() < 15 {
			t.Errorf("%d chat requests: the faults never fired", n.Load())
		}
	})
}

// TestCollectRerunsErrors: a batch that ended with error records completes
// when collected again; the reruns are bounded and can be turned off.
func TestCollectRerunsErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var broken atomic.Bool
		broken.Store(true)
		e := newBatchEnv(t, testTasks(2), policytest.Options{Script: clicksThenDone(1),
			Faults: func(int, policytest.Request) policytest.Fault {
				if broken.Load() {
					// A 400 naming the request: the attempt's own failure.
					// (A 500 would pause the batch: see
					// TestCollectRidesThroughCompletionFaults.)
					return policytest.FaultValidationError
				}
				return policytest.NoFault
			}}, fake.Config{})
		e.opts.ErrorReruns = 1
		// rerunnable is what the error says collecting again reruns; -1
		// when the batch completes.
		run := func(name string, want map[Status]int, wantErr error, rerunnable int) *Summary {
			t.Helper()
			e.fleet = fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
			e.opts.NewDesktop = e.fleet.New
			e.groups = nil
			sum, err := e.collect(t.Context())
			if !errorsIs(err, wantErr) {
				t.Fatalf("%s: Collect: %v, want %v", name, err, wantErr)
			}
			var inc *IncompleteError
			if errors.As(err, &inc) && inc.Rerunnable != rerunnable {
				t.Errorf("%s: the error says collecting again reruns %d, want %d: %v", name, inc.Rerunnable, rerunnable, err)
			}
			if rerunnable == 0 && !strings.Contains(fmt.Sprint(err), "reruns none") {
				t.Errorf("%s: error %q does not say that collecting again reruns none", name, err)
			}
			recs := readRecords(t, e.opts.Out)
			if diff := cmp.Diff(want, statusCounts(recs)); diff != "" {
				t.Errorf("%s: statuses (-want +got):\n%s", name, diff)
			}
			return sum
		}
		sum := run("first run", map[Status]int{StatusError: 4}, ErrBatchIncomplete, 4)
		if sum.State != schema.StateIncomplete || sum.PolicyErrors != 4 {
			t.Errorf("first run: state %q, %d policy errors; want incomplete, 4", sum.State, sum.PolicyErrors)
		}
		// Still broken: the one rerun allowed fails too.
		run("rerun, still failing", map[Status]int{StatusError: 8}, ErrBatchIncomplete, 0)
		// Fixed, but the bound is used up.
		broken.Store(false)
		run("past the bound", map[Status]int{StatusError: 8}, ErrBatchIncomplete, 0)

		// A new batch: fixed between runs, with reruns off, then on.
		e.opts.Out += "-2"
		broken.Store(true)
		run("second batch", map[Status]int{StatusError: 4}, ErrBatchIncomplete, 4)
		broken.Store(false)
		e.opts.ErrorReruns = -1
		// Reruns off for this run only: the batch's bound still allows one.
		run("no reruns", map[Status]int{StatusError: 4}, ErrBatchIncomplete, 4)
		e.opts.ErrorReruns = 0
		sum = run("reruns", map[Status]int{StatusError: 4, StatusOK: 4}, nil, -1)
		if sum.State != schema.StateComplete || sum.ErrorsRerun != 4 || sum.PolicyErrors != 0 {
			t.Errorf("after the rerun: state %q, %d errors rerun, %d policy errors; want complete, 4, 0", sum.State, sum.ErrorsRerun, sum.PolicyErrors)
		}
		checkBatch(t, e, sum, true)
	})
}

// TestCollectWarnsAboutMissingLogprobs: a server without logprobs gives a
// batch that says so in its summary.
func TestCollectWarnsAboutMissingLogprobs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1),
			Faults: policytest.FaultAlways(policytest.FaultNoLogprobs)}, fake.Config{})
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Warnings) == 0 || !strings.Contains(sum.Warnings[0], "4 of 4 steps have no logprobs") {
			t.Errorf("summary warnings %q; want one naming the 4 steps without logprobs", sum.Warnings)
		}
	})
}

// TestCollectMarksBadLogprobs: a server that sends null logprobs, or one
// fewer than token ids, gives steps marked with the defect, counted in the
// summary and warned about once per kind, with the count, on the log.
func TestCollectMarksBadLogprobs(t *testing.T) {
	tests := []struct {
		fault         policytest.Fault
		warning       string
		wantNonFinite int
		wantMismatch  int
		wantLog       string
	}{
		{policytest.FaultNullLogprobs, schema.WarnNonFiniteLogprobs, 4, 0, "the model server sent null, NaN or infinite logprobs"},
		{policytest.FaultLogprobsMismatch, schema.WarnLogprobsMismatch, 0, 4, "the model server sent a number of logprobs other than of token ids"},
	}
	for _, tt := range tests {
		t.Run(tt.fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1),
					Faults: policytest.FaultAlways(tt.fault)}, fake.Config{})
				var log bytes.Buffer
				var mu sync.Mutex
				e.opts.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))
				sum, err := e.collect(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				for _, rec := range readRecords(t, e.opts.Out) {
					for i, st := range rec.Steps {
						if st.LogprobDefect() != tt.warning || !slices.Contains(st.Warnings, tt.warning) {
							t.Errorf("rollout %s step %d: warnings %q, want %s", rec.RolloutID, i, st.Warnings, tt.warning)
						}
						if tt.fault == policytest.FaultNullLogprobs && st.Response.Logprobs != nil {
							t.Errorf("rollout %s step %d kept logprobs %v from null ones", rec.RolloutID, i, st.Response.Logprobs)
						}
					}
				}
				if sum.StepsNonFiniteLogprobs != tt.wantNonFinite || sum.StepsLogprobsMismatch != tt.wantMismatch {
					t.Errorf("summary counts %d non-finite and %d mismatched steps, want %d and %d",
						sum.StepsNonFiniteLogprobs, sum.StepsLogprobsMismatch, tt.wantNonFinite, tt.wantMismatch)
				}
				if !slices.ContainsFunc(sum.Warnings, func(w string) bool { return strings.Contains(w, "4 of 4 steps") && strings.Contains(w, tt.warning) }) {
					t.Errorf("summary warnings %q; want one naming the 4 steps %s", sum.Warnings, tt.warning)
				}
				var onDisk schema.Summary
				if b, err := os.ReadFile(filepath.Join(e.opts.Out, "summary.json")); err != nil {
					t.Error(err)
				} else if err := json.Unmarshal(b, &onDisk); err != nil {
					t.Error(err)
				} else if onDisk.StepsNonFiniteLogprobs != tt.wantNonFinite || onDisk.StepsLogprobsMismatch != tt.wantMismatch {
					t.Errorf("summary.json counts %d and %d, want %d and %d", onDisk.StepsNonFiniteLogprobs, onDisk.StepsLogprobsMismatch, tt.wantNonFinite, tt.wantMismatch)
				}
				mu.Lock()
				got := log.String()
				mu.Unlock()
				if n := strings.Count(got, tt.wantLog); n != 1 {
					t.Errorf("log warns %d times %q, want once:\n%s", n, tt.wantLog, got)
				}
				if !strings.Contains(got, "steps=2 of=2") {
					t.Errorf("log %q does not count the rollout's steps", got)
				}
				if strings.Contains(got, "returned no logprobs") {
					t.Errorf("log calls the steps without logprobs:\n%s", got)
				}
			})
		})
	}
}

// lockedWriter serializes the writes of a log shared by workers.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestCollectRefusesHugeGroups: a group size that would allocate gigabytes
// is refused before anything is allocated or started.
func TestCollectRefusesHugeGroups(t *testing.T) {
	fleet := fake.NewFleet(fake.Config{})
	for _, o := range []CollectOptions{
		{Group: 1000000},
		{Group: 1 << 62, Oversample: 0.5},
		{Group: 1024, Oversample: 8},
	} {
		o.Out, o.NewDesktop = t.TempDir(), fleet.New
		tasks := testTasks(200)
		_, err := Collect(context.Background(), tasks, PolicyConfig{BaseURL: "http://127.0.0.1:1/v1", Model: "m", Version: "v"}, o)
		if !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("group %d oversample %v: %v, want ErrInvalidOptions", o.Group, o.Oversample, err)
		}
	}
	if n := len(fleet.Desktops()); n != 0 {
		t.Errorf("%d desktops created for refused batches", n)
	}
}

// TestRolloutClockPausedPastItsDeadline: a pause that stops the timer after
// the deadline passed, before it fired, still ends the stepping on resume.
func TestRolloutClockPausedPastItsDeadline(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	c := &rolloutClock{timer: time.AfterFunc(time.Hour, func() {}), cancel: cancel, left: -time.Millisecond}
	defer c.stop()
	c.resume()
	if !errors.Is(context.Cause(ctx), errRolloutTimeout) {
		t.Errorf("after resume past the deadline: cause %v, want errRolloutTimeout", context.Cause(ctx))
	}
}
