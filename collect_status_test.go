package rl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestCollectStatus runs one batch per way an attempt can end and checks
// the statuses it records, and what else that path promises.
func TestCollectStatus(t *testing.T) {
	tests := []struct {
		name  string
		tasks int
		srv   policytest.Options
		desk  fake.Config
		// setup adjusts the options (defaults: 2 desktops, G = 2).
		setup   func(e *batchEnv)
		want    map[Status]int
		wantErr error
		check   func(t *testing.T, e *batchEnv, recs []schema.Record)
	}{
		{
			name: "ok: the agent ends the attempt", tasks: 2,
			srv:  policytest.Options{Script: clicksThenDone(2)},
			desk: fake.Config{DefaultReward: fake.Reward{P: 1}},
			want: map[Status]int{StatusOK: 4},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					last := r.Steps[len(r.Steps)-1]
					if r.NSteps != 3 || len(last.Actions) != 1 || last.Actions[0].Action != desktop.DoneCode || *r.Reward != 1 {
						t.Errorf("%s: %d steps ending in %+v, reward %v; want 3 steps ending in DONE, reward 1", r.RolloutID, r.NSteps, last.Actions, *r.Reward)
					}
				}
			},
		},
		{
			name: "ok: max steps reached", tasks: 1,
			srv:   policytest.Options{Script: neverDone},
			setup: func(e *batchEnv) { e.opts.MaxSteps = 3 },
			want:  map[Status]int{StatusOK: 2},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					if r.NSteps != 3 || r.Reward == nil {
						t.Errorf("%s: %d steps, reward %v; want 3 steps, graded", r.RolloutID, r.NSteps, r.Reward)
					}
				}
			},
		},
		{
			name: "truncated: rollout timeout", tasks: 1,
			srv:  policytest.Options{Script: neverDone},
			desk: fake.Config{Latency: fake.Latencies{Act: fake.Latency{Fixed: time.Second}, Evaluate: fake.Latency{Fixed: 3 * time.Second}}},
			setup: func(e *batchEnv) {
				e.opts.MaxSteps = 100
				e.opts.RolloutTimeout = 2500 * time.Millisecond
			},
			want: map[Status]int{StatusTruncated: 2},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					// Steps at 0 s, 1 s, 2 s; the third act is cut at 2.5 s;
					// grading then takes its 3 s.
					if r.NSteps != 3 || r.Reward == nil || r.Timing.EvalS != 3 || r.Timing.TotalS != 5.5 {
						t.Errorf("%s: %d steps, reward %v, timing %+v; want 3 steps, graded for 3 s, 5.5 s in all", r.RolloutID, r.NSteps, r.Reward, r.Timing)
					}
				}
			},
		},
		{
			name: "cancelled: the group closed while it stepped", tasks: 1,
			srv: policytest.Options{Script: clicksThenDone(1)},
			// The second desktop hangs on its first action until cancelled.
			desk: fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseAct, Kind: fake.FaultHang, Prob: 1, Desktop: "fake-1"}}},
			setup: func(e *batchEnv) {
				e.opts.Group = 1
				e.opts.Oversample = 1
			},
			want: map[Status]int{StatusOK: 1, StatusCancelled: 1},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					if r.Status == StatusCancelled && (r.Desktop != 1 || r.NSteps != 1) {
						t.Errorf("cancelled record on desktop %d with %d steps; want desktop 1, 1 step", r.Desktop, r.NSteps)
					}
				}
				checkNotReplaced(t, e)
			},
		},
		{
			name: "skipped: the group closed before it started", tasks: 1,
			srv: policytest.Options{Script: clicksThenDone(1)},
			setup: func(e *batchEnv) {
				e.opts.Desktops = 1
				e.opts.Group = 1
				e.opts.Oversample = 2
			},
			want: map[Status]int{StatusOK: 1, StatusSkipped: 2},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				if st := e.fleet.Stats(); st.Resets != 1 {
					t.Errorf("%d resets; skipped attempts must not touch a desktop", st.Resets)
				}
			},
		},
		{
			name: "surplus: grading when the group closed", tasks: 1,
			srv: policytest.Options{Script: clicksThenDone(0)},
			setup: func(e *batchEnv) {
				// Slot 0 resets for 10 s and grades at once; slot 1 resets
				// at once and grades for 20 s, so its attempt is grading
				// when slot 0's closes the group at 10 s.
				fast := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, Latency: fake.Latencies{Reset: fake.Latency{Fixed: 10 * time.Second}}, DefaultReward: fake.Reward{P: 1}})
				slow := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, Latency: fake.Latencies{Evaluate: fake.Latency{Fixed: 20 * time.Second}}, DefaultReward: fake.Reward{P: 1}})
				e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
					if slot == 0 {
						return fast.New(ctx, slot)
					}
					return slow.New(ctx, slot)
				}
				e.opts.Group = 1
				e.opts.Oversample = 1
			},
			want: map[Status]int{StatusOK: 1, StatusSurplus: 1},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					want := map[Status]int{StatusOK: 0, StatusSurplus: 1}[r.Status]
					if r.Desktop != want || r.Reward == nil || *r.Reward != 1 {
						t.Errorf("%s record on desktop %d, reward %v; want desktop %d, reward 1", r.Status, r.Desktop, r.Reward, want)
					}
				}
			},
		},
		{
			name: "retried: the desktop failed once", tasks: 1,
			srv:  policytest.Options{Script: clicksThenDone(1)},
			desk: fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, OnCall: 1, Desktop: "fake-0"}}},
			setup: func(e *batchEnv) {
				e.opts.Desktops = 1
				e.opts.Group = 1
			},
			want: map[Status]int{StatusRetried: 1, StatusOK: 1},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				r0, r1 := recs[0], recs[1]
				if r0.Status != StatusRetried || r0.Attempt != r1.Attempt || r0.GroupID != r1.GroupID || r0.RolloutID == r1.RolloutID {
					t.Errorf("records %s %s a%d, %s %s a%d: want a retried try, then the same attempt with its own id", r0.RolloutID, r0.Status, r0.Attempt, r1.RolloutID, r1.Status, r1.Attempt)
				}
				if !strings.Contains(r0.Error.Message, "injected") {
					t.Errorf("retried record's error %q does not say what failed", r0.Error.Message)
				}
				var names []string
				for _, d := range e.fleet.Desktops() {
					names = append(names, d.Name())
				}
				if diff := cmp.Diff([]string{"fake-0", "fake-0.1"}, names); diff != "" {
					t.Errorf("desktops (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "error env: the desktop failed after the retries", tasks: 1,
			srv:  policytest.Options{Script: clicksThenDone(1)},
			desk: fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseAct, Kind: fake.FaultCrash, Prob: 1}}},
			setup: func(e *batchEnv) {
				e.opts.Desktops = 1
				e.opts.Group = 1
				e.opts.EnvRetries = 2
			},
			want:    map[Status]int{StatusRetried: 2, StatusError: 1},
			wantErr: ErrBatchIncomplete,
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				if last := recs[len(recs)-1]; last.Error.Kind != schema.ErrorEnv || !strings.Contains(last.Error.Message, "crashed") {
					t.Errorf("error %+v, want kind env naming the crash", last.Error)
				}
				if n := len(e.fleet.Desktops()); n != 3 {
					t.Errorf("fleet made %d desktops, want 3: one per try", n)
				}
			},
		},
		{
			name: "error env: the task is unsupported", tasks: 1,
			srv:     policytest.Options{Script: clicksThenDone(1)},
			desk:    fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultUnsupported, Prob: 1}}},
			want:    map[Status]int{StatusError: 2},
			wantErr: ErrBatchIncomplete,
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					if r.Error.Kind != schema.ErrorEnv || !strings.Contains(r.Error.Message, "unsupported") {
						t.Errorf("error %+v, want kind env saying unsupported", r.Error)
					}
				}
				checkNotReplaced(t, e)
			},
		},
		{
			// The probe's one-token generation is served, so the server
			// serves and the call is what fails: sent three times, then
			// the attempt's error. (A server failing the probe too pauses
			// the batch: collect_breaker_test.go.)
			name: "error policy: a call fails after the retries and resends", tasks: 1,
			srv: policytest.Options{KeepRequests: true, Faults: func(_ int, r policytest.Request) policytest.Fault {
				if isProbe(r) {
					return policytest.NoFault
				}
				return policytest.FaultServerError
			}},
			want:    map[Status]int{StatusError: 2},
			wantErr: ErrBatchIncomplete,
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					if r.Error.Kind != schema.ErrorPolicy || r.NSteps != 0 {
						t.Errorf("error %+v with %d steps, want kind policy and no step", r.Error, r.NSteps)
					}
				}
				steps := 0
				for _, r := range e.srv.Requests() {
					if !isProbe(r) {
						steps++
					}
				}
				if want := 2 * 3 * 2; steps != want {
					t.Errorf("server got %d step requests, want %d: three sends of one retry per call", steps, want)
				}
			},
		},
		{
			name: "error policy: a hanging call is bounded by the step timeout", tasks: 1,
			srv: policytest.Options{Faults: func(_ int, r policytest.Request) policytest.Fault {
				if isProbe(r) {
					return policytest.NoFault
				}
				return policytest.FaultHang
			}},
			setup: func(e *batchEnv) {
				e.pol.StepTimeout = 10 * time.Second
				e.pol.Retries = 2
			},
			want:    map[Status]int{StatusError: 2},
			wantErr: ErrBatchIncomplete,
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					// Three tries of 10 s; the server then serves the
					// probe, so the call is sent twice more, and nothing
					// else takes time.
					if !strings.Contains(r.Error.Message, "no complete answer") || r.Timing.ModelS != 90 || r.Timing.TotalS != 90 || r.Timing.ServerDownS != 0 {
						t.Errorf("error %q after %+v; want a timeout after 3·(2+1)·10 s", r.Error.Message, r.Timing)
					}
				}
			},
		},
		{
			name: "ok: a reply that does not parse is a step without action", tasks: 1,
			srv: policytest.Options{Script: func(req policytest.Request) string {
				if req.Step == 0 {
					return "I would rather not."
				}
				return reply(doneArgs)
			}},
			want: map[Status]int{StatusOK: 2},
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					s := r.Steps[0]
					if r.NSteps != 2 || s.ParseError == "" || len(s.Actions) != 0 || s.Response.Content != "I would rather not." {
						t.Errorf("%d steps, first %+v; want 2, the first with the reply, a parse error and no action", r.NSteps, s)
					}
				}
			},
		},
		{
			name: "error env: no desktop can be created", tasks: 2,
			desk:    fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseCreate, Kind: fake.FaultError, Prob: 1}}},
			want:    map[Status]int{StatusError: 4},
			wantErr: ErrBatchIncomplete,
			check: func(t *testing.T, e *batchEnv, recs []schema.Record) {
				for _, r := range recs {
					if r.Error.Kind != schema.ErrorEnv || !strings.Contains(r.Error.Message, "no desktop") {
						t.Errorf("error %+v, want kind env saying there is no desktop", r.Error)
					}
				}
			},
		},
		{
			name: "ok: a desktop is created on the second try", tasks: 1,
			srv:  policytest.Options{Script: clicksThenDone(1)},
			desk: fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseCreate, Kind: fake.FaultError, OnCall: 1}}},
			want: map[Status]int{StatusOK: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newBatchEnv(t, testTasks(tt.tasks), tt.srv, tt.desk)
				if tt.setup != nil {
					tt.setup(e)
				}
				sum, err := e.collect(t.Context())
				if !errorsIs(err, tt.wantErr) {
					t.Fatalf("Collect: %v, want %v", err, tt.wantErr)
				}
				recs := checkBatch(t, e, sum, true)
				if diff := cmp.Diff(tt.want, statusCounts(recs)); diff != "" {
					t.Errorf("statuses (-want +got):\n%s", diff)
				}
				checkClosed(t, e.fleet)
				if tt.check != nil && len(recs) > 0 {
					tt.check(t, e, recs)
				}
			})
		})
	}
}

// TestCollectStopsOnRefusal checks that a server refusing the key stops the
// batch at once, with the server's error and no record of the attempts it
// refused, so that they run when the batch is resumed with the right key.
func TestCollectStopsOnRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBatchEnv(t, testTasks(4), policytest.Options{APIKey: "right key", Script: clicksThenDone(1)}, fake.Config{})
		e.pol.APIKey = "wrong key"
		_, err := e.collect(t.Context())
		if !errors.Is(err, policy.ErrUnauthorized) {
			t.Fatalf("Collect: %v, want policy.ErrUnauthorized", err)
		}
		if strings.Contains(err.Error(), "wrong key") {
			t.Errorf("error %q shows the API key", err)
		}
		if recs := readRecords(t, e.opts.Out); len(recs) != 0 {
			t.Errorf("%d records, want none", len(recs))
		}
		if n := e.srv.Stats().Requests; n > e.opts.Desktops {
			t.Errorf("server got %d requests, want at most one per desktop", n)
		}
		checkClosed(t, e.fleet)

		e.pol.APIKey = "right key"
		e.fleet = fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
		e.opts.NewDesktop = e.fleet.New
		sum, err := e.collect(t.Context())
		if err != nil {
			t.Fatalf("resumed Collect: %v", err)
		}
		recs := checkBatch(t, e, sum, true)
		if diff := cmp.Diff(map[Status]int{StatusOK: 8}, statusCounts(recs)); diff != "" {
			t.Errorf("statuses after resume (-want +got):\n%s", diff)
		}
	})
}

// checkNotReplaced fails the test if a desktop was replaced: the fleet
// names replacements "fake-<slot>.<n>".
func checkNotReplaced(t *testing.T, e *batchEnv) {
	t.Helper()
	for _, d := range e.fleet.Desktops() {
		if strings.Contains(d.Name(), ".") {
			t.Errorf("desktop %s replaced one that did not fail", d.Name())
		}
	}
}
