package rl

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// newLoopbackEnv is newBatchEnv with the model server on a real port of
// 127.0.0.1, in real time: the faults below are the transport's (dropped
// bodies, hangs), which a pipe does not show as a socket does.
func newLoopbackEnv(t *testing.T, tasks []Task, srvOpts policytest.Options) *batchEnv {
	t.Helper()
	e := newBatchEnv(t, tasks, policytest.Options{}, fake.Config{})
	srvOpts.NoLatency = true
	srv, err := policytest.Listen("127.0.0.1:0", srvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	e.srv = srv
	e.pol.BaseURL, e.pol.HTTPClient = srv.URL(), srv.Client()
	return e
}

// isProbe tells the breaker's one-token generation from a step's call:
// steps ask for logprobs, the probe does not.
func isProbe(r policytest.Request) bool { return !r.Logprobs }

// TestCollectRidesThroughCompletionFaults: with one replica, completions
// fail for a while in each way a broken engine or its gateway fails, while
// GET /models still answers; the batch pauses (server_down_s > 0) and ends
// complete with no error record. Every HTTP request of a step counts in
// its model attempts, resends after the pause included, so retried_calls
// counts them.
func TestCollectRidesThroughCompletionFaults(t *testing.T) {
	for _, kind := range []policytest.Fault{
		policytest.FaultUnavailable, policytest.FaultServerError, policytest.FaultTruncatedBody,
		policytest.FaultHTML, policytest.FaultHang,
	} {
		t.Run(kind.String(), func(t *testing.T) { ridesThroughCompletionFault(t, kind) })
	}
}

func ridesThroughCompletionFault(t *testing.T, kind policytest.Fault) {
	var sw policytest.Switch
	var calls, probesFailed atomic.Int64
	e := newLoopbackEnv(t, testTasks(3), policytest.Options{Script: clicksThenDone(2),
		Faults: func(n int, r policytest.Request) policytest.Fault {
			if !isProbe(r) && calls.Add(1) == 4 {
				sw.Set(kind) // mid-batch
			}
			f := sw.Faults(n, r)
			// The window ends by events: once the breaker opened and
			// its probe failed twice (the batch has waited on a broken
			// server), not after a sleep.
			if f != policytest.NoFault && isProbe(r) && probesFailed.Add(1) == 2 {
				sw.Set(policytest.NoFault)
			}
			return f
		}})
	if kind == policytest.FaultHang {
		// A hang is found by the step timeout; the probe's is the same.
		e.pol.StepTimeout, e.pol.Retries = time.Second, 0
	}
	sum, err := e.collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	recs := checkBatch(t, e, sum, true)
	if diff := cmp.Diff(map[Status]int{StatusOK: 6}, statusCounts(recs)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if probesFailed.Load() < 2 || sw.Faulted() < 3 {
		t.Fatalf("%d probes and %d requests in all failed: the fault window never opened", probesFailed.Load(), sw.Faulted())
	}
	if sum.State != schema.StateComplete || sum.ServerDownS <= 0 || sum.PolicyErrors != 0 {
		t.Errorf("summary: state %q, server down %v s, %d policy errors; want complete, above 0, none", sum.State, sum.ServerDownS, sum.PolicyErrors)
	}
	var paused float64
	attempts, retried := 0, 0
	for _, r := range recs {
		paused += r.Timing.ServerDownS
		for _, s := range r.Steps {
			attempts += s.Model.Attempts
			if s.Model.Attempts > 1 {
				retried++
			}
		}
	}
	if paused <= 0 {
		t.Errorf("records paused %v s in all, want above 0", paused)
	}
	// No call ended in an error, so every step request the server saw is
	// one of a step's attempts.
	if int64(attempts) != calls.Load() || retried == 0 || sum.RetriedCalls != retried {
		t.Errorf("steps count %d attempts, the server saw %d step requests; %d steps retried, retried_calls %d; want equal, above 0",
			attempts, calls.Load(), retried, sum.RetriedCalls)
	}
}

// TestCollectBadRequestFailsOnlyItsAttempt: a 400 naming the request (a
// validation error) is that attempt's policy error; the batch neither
// pauses nor probes.
func TestCollectBadRequestFailsOnlyItsAttempt(t *testing.T) {
	var probes atomic.Int64
	e := newLoopbackEnv(t, testTasks(3), policytest.Options{Script: clicksThenDone(2),
		Faults: func(n int, r policytest.Request) policytest.Fault {
			if isProbe(r) {
				probes.Add(1)
			}
			if strings.Contains(r.Instruction, "do thing number 0") && r.Step == 1 {
				return policytest.FaultValidationError
			}
			return policytest.NoFault
		}})
	sum, err := e.collect(t.Context())
	recs := readRecords(t, e.opts.Out)
	if err == nil {
		t.Fatalf("Collect: no error, want the batch incomplete; %v", statusCounts(recs))
	}
	if diff := cmp.Diff(map[Status]int{StatusOK: 4, StatusError: 2}, statusCounts(recs)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	for _, r := range recs {
		if r.Status == StatusError && r.TaskID != "t0" {
			t.Errorf("%s: error record of task %s, want only t0's", r.RolloutID, r.TaskID)
		}
	}
	if sum.ServerDownS != 0 || sum.PolicyErrors != 2 || probes.Load() != 0 {
		t.Errorf("server down %v s, %d policy errors, %d probes; want 0, 2, 0", sum.ServerDownS, sum.PolicyErrors, probes.Load())
	}
}

// TestCollectHangingProbeKeepsTheLimit: the probe is a generation, and a
// hung server holds it; --server-down-timeout still bounds the wait from
// the breaker's opening, not the probe's own timeout.
func TestCollectHangingProbeKeepsTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(1), policytest.Options{Script: clicksThenDone(1),
			Faults: policytest.FaultAlways(policytest.FaultHang)}, fake.Config{})
		e.pol.StepTimeout, e.pol.Retries = time.Minute, 0
		e.opts.ServerDownTimeout = 10 * time.Second
		start := time.Now()
		_, err := e.collect(t.Context())
		if !errors.Is(err, ErrServerDown) {
			t.Fatalf("Collect: %v, want ErrServerDown", err)
		}
		// One step timeout for the call, then the limit; a probe of its
		// own 30 s timeout would end it at 90 s.
		if took := time.Since(start); took > time.Minute+10*time.Second+time.Second {
			t.Errorf("the batch stopped after %v, want by 1m10s", took)
		}
	})
}
