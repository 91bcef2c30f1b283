package rl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var (
	invariantSeeds = flag.Int("invariant.seeds", 16, "number of random batches TestCollectInvariants runs")
	invariantSeed  = flag.Uint64("invariant.seed", 0, "run only this seed of TestCollectInvariants (0: seeds 1 to -invariant.seeds)")
)

// TestCollectInvariants runs random batches (tasks, G, oversample, desktops,
// steps, timeouts, latencies, desktop and server faults, and sometimes a
// Ctrl-C and a resume) and checks what must hold of any batch (checkBatch),
// and that no finished attempt is lost: every successful Evaluate becomes
// exactly one graded record. goleak (TestMain) and synctest (every goroutine
// of the bubble must end) check that nothing is left running.
//
// A failing seed reruns alone with -invariant.seed N -v, which logs its
// configuration.
func TestCollectInvariants(t *testing.T) {
	first, last := uint64(1), uint64(*invariantSeeds)
	if *invariantSeed != 0 {
		first, last = *invariantSeed, *invariantSeed
	}
	for seed := first; seed <= last; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			// Batches wait mostly for fsync: let them overlap.
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { runRandomBatch(t, seed) })
		})
	}
}

// randomBatch is one random batch configuration.
type randomBatch struct {
	tasks    []Task
	srv      policytest.Options
	desk     fake.Config
	setup    func(e *batchEnv)
	cancelAt time.Duration // 0: run to the end
	describe string
}

func newRandomBatch(seed uint64) randomBatch {
	r := rand.New(rand.NewPCG(seed, 0x1e6a70))
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	dur := func(maxS float64) time.Duration { return time.Duration(r.Float64() * maxS * float64(time.Second)) }
	var b randomBatch

	for i := range 1 + r.IntN(6) {
		t := Task{ID: fmt.Sprintf("task-%d", i), Domain: "os", Instruction: fmt.Sprintf("seed %d task %d", seed, i),
			Evaluator: json.RawMessage(`{"func":"exact_match"}`)}
		if r.IntN(5) == 0 {
			t.Evaluator = json.RawMessage(`{"func":"infeasible"}`)
		}
		b.tasks = append(b.tasks, t)
	}
	group := 1 + r.IntN(4)
	oversample := pick(0, 0, 0.25, 0.5, 1)
	desktops := 1 + r.IntN(5)
	maxSteps := 1 + r.IntN(6)
	envRetries := []int{-1, 0, 2}[r.IntN(3)]
	retries := r.IntN(3)
	var rolloutTimeout time.Duration
	if r.IntN(2) == 0 {
		rolloutTimeout = 3*time.Second + dur(20)
	}
	var ready desktop.ReadyOptions
	var fixed *desktop.FixedWaits
	switch r.IntN(3) {
	case 0:
		ready = desktop.ReadyOptions{Interval: 200 * time.Millisecond, Max: dur(5) + time.Millisecond}
	case 1:
		b.desk.ReadyWaiter = true
	case 2:
		fixed = &desktop.FixedWaits{AfterAction: dur(2), AfterReset: dur(5), BeforeEval: dur(3)}
	}

	// The server: a script that ends, never ends or rambles, on a fast or
	// a loaded server, with faults on some requests.
	script := []func(policytest.Request) string{policytest.DefaultScript, neverDone, clicksThenDone(2), func(req policytest.Request) string {
		if (req.N+req.Step)%3 == 0 {
			return "no idea"
		}
		return policytest.DefaultScript(req)
	}}[r.IntN(4)]
	b.srv = policytest.Options{Script: script, RetryAfter: time.Second}
	if r.IntN(2) == 0 {
		b.srv.Latency = policytest.Latency{Base: 500*time.Millisecond + dur(2), PerToken: time.Millisecond, Knee: 1 + r.IntN(8)}
	}
	serverFaults := []policytest.Fault{policytest.FaultServerError, policytest.FaultRateLimit, policytest.FaultMalformedJSON,
		policytest.FaultTruncatedBody, policytest.FaultHang, policytest.FaultFlatError, policytest.FaultLogprobsMismatch}
	if p := pick(0, 0, 0.05, 0.2); p > 0 {
		fseed := r.Uint64()
		b.srv.Faults = func(n int, _ policytest.Request) policytest.Fault {
			fr := rand.New(rand.NewPCG(fseed, uint64(n)))
			if fr.Float64() < p {
				return serverFaults[fr.IntN(len(serverFaults))]
			}
			return policytest.NoFault
		}
	}

	// The desktops: heavy-tailed latencies and faults.
	b.desk.Seed = r.Uint64()
	b.desk.DefaultReward = fake.Reward{P: r.Float64()}
	b.desk.Latency = fake.Latencies{
		Create:   fake.Latency{Max: dur(10)},
		Reset:    fake.Latency{Fixed: dur(3), Alpha: 1.5, Scale: 100 * time.Millisecond, Cap: time.Minute},
		Observe:  fake.Latency{Max: dur(0.3)},
		Act:      fake.Latency{Median: dur(0.5) + time.Millisecond, Sigma: 0.5},
		Settle:   fake.Latency{Max: dur(2)},
		Evaluate: fake.Latency{Fixed: dur(2), Alpha: 1.2, Scale: 50 * time.Millisecond, Cap: time.Minute},
	}
	phases := []fake.Phase{fake.PhaseCreate, fake.PhaseReset, fake.PhaseWaitAfterReset, fake.PhaseObserve,
		fake.PhaseAct, fake.PhaseWaitReady, fake.PhaseWaitBeforeEval, fake.PhaseEvaluate}
	for range r.IntN(4) {
		f := fake.Fault{Phase: phases[r.IntN(len(phases))], Kind: fake.FaultKind(1 + r.IntN(3)), Prob: pick(0.02, 0.05, 0.2)}
		switch {
		case r.IntN(8) == 0:
			f.Kind = fake.FaultUnsupported
		case f.Kind == fake.FaultHang && (rolloutTimeout == 0 || !stepPhase(f.Phase)):
			// Only the rollout timeout bounds a hanging desktop: a hang
			// anywhere else would hold the batch forever.
			f.Kind = fake.FaultError
		}
		b.desk.Faults = append(b.desk.Faults, f)
	}
	if r.IntN(3) == 0 {
		b.cancelAt = dur(60)
	}

	b.setup = func(e *batchEnv) {
		e.opts.Group, e.opts.Oversample, e.opts.Desktops, e.opts.MaxSteps = group, oversample, desktops, maxSteps
		e.opts.EnvRetries, e.opts.RolloutTimeout, e.opts.Ready = envRetries, rolloutTimeout, ready
		if fixed != nil {
			e.opts.NewDesktop = desktop.WithFixedWaits(e.opts.NewDesktop, *fixed)
		}
		e.opts.ProgressInterval = 3 * time.Second
		e.opts.Progress = func(Progress) {}
		e.pol.Retries, e.pol.StepTimeout = retries, 10*time.Second
		if r.IntN(3) == 0 {
			e.pol.MaxInflight = 1 + r.IntN(3)
		}
	}
	b.describe = fmt.Sprintf("%d tasks, G %d, oversample %v, %d desktops, max steps %d, env retries %d, retries %d, rollout timeout %v, ready %+v, fixed waits %+v, server %+v, desktop faults %+v, cancel at %v",
		len(b.tasks), group, oversample, desktops, maxSteps, envRetries, retries, rolloutTimeout, ready, fixed, b.srv.Latency, b.desk.Faults, b.cancelAt)
	return b
}

// stepPhase reports whether calls of phase p run under the rollout timeout.
func stepPhase(p fake.Phase) bool {
	return p == fake.PhaseObserve || p == fake.PhaseAct || p == fake.PhaseWaitReady
}

func runRandomBatch(t *testing.T, seed uint64) {
	b := newRandomBatch(seed)
	t.Logf("seed %d: %s", seed, b.describe)
	e := newBatchEnv(t, b.tasks, b.srv, b.desk)
	b.setup(e)
	evals := countEvaluations(e)

	ctx := t.Context()
	if b.cancelAt > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := time.AfterFunc(b.cancelAt, cancel)
		defer stop.Stop()
	}
	sum, err := e.collect(ctx)
	complete := true
	if b.cancelAt > 0 && errors.Is(err, context.Canceled) {
		complete = false
	} else {
		checkCollectErr(t, e, err)
	}
	recs := checkBatch(t, e, sum, complete)
	checkClosed(t, e.fleet)
	checkEvaluations(t, "first run", recs, evals.Load())
	checkDesktopChurn(t, e, recs)
	if complete {
		return
	}

	// Resume the stopped batch with new desktops.
	t.Logf("stopped with %d records; resuming", len(recs))
	e.fleet = fake.NewFleet(withTestScreen(b.desk))
	e.opts.NewDesktop = e.fleet.New
	b.setup(e)
	evals = countEvaluations(e)
	e.groups = nil
	sum, err = e.collect(t.Context())
	checkCollectErr(t, e, err)
	all := checkBatch(t, e, sum, true)
	checkClosed(t, e.fleet)
	checkEvaluations(t, "resumed run", all[len(recs):], evals.Load())
}

// checkCollectErr checks that Collect returned nil exactly when every group
// closed, and ErrBatchIncomplete otherwise.
func checkCollectErr(t *testing.T, e *batchEnv, err error) {
	t.Helper()
	opts := e.opts.withDefaults()
	finished := map[string]int{}
	for _, r := range readRecords(t, e.opts.Out) {
		if r.Status.Finished() {
			finished[r.GroupID]++
		}
	}
	short := 0
	for _, task := range e.tasks {
		if finished[groupID(e.pol.Version, task.ID)] < opts.Group {
			short++
		}
	}
	switch {
	case short == 0 && err != nil:
		t.Errorf("Collect: %v, but every group closed", err)
	case short > 0 && !errors.Is(err, ErrBatchIncomplete):
		t.Errorf("Collect: %v, but %d groups did not close: want ErrBatchIncomplete", err, short)
	}
}

// checkEvaluations checks that the attempts graded by a run, and only
// those, were recorded as graded.
func checkEvaluations(t *testing.T, run string, recs []schema.Record, evals int64) {
	t.Helper()
	graded := 0
	for _, r := range recs {
		if r.Status.Graded() {
			graded++
		}
	}
	if int64(graded) != evals {
		t.Errorf("%s: %d successful Evaluate calls, %d graded records: a finished attempt was lost or invented", run, evals, graded)
	}
}

// checkDesktopChurn checks that desktops are replaced only after a failure:
// no more were created than the workers and the failed tries need.
func checkDesktopChurn(t *testing.T, e *batchEnv, recs []schema.Record) {
	t.Helper()
	failed := 0
	for _, r := range recs {
		if r.Status == StatusRetried || (r.Status == StatusError && r.Error.Kind == schema.ErrorEnv) {
			failed++
		}
	}
	if n, max := len(e.fleet.Desktops()), e.opts.withDefaults().Desktops+failed; n > max {
		t.Errorf("%d desktops created for %d workers and %d desktop failures", n, e.opts.Desktops, failed)
	}
}

// countEvaluations wraps the batch's desktops so that successful Evaluate
// calls are counted.
func countEvaluations(e *batchEnv) *atomic.Int64 {
	n := new(atomic.Int64)
	newDesktop := e.opts.NewDesktop
	e.opts.NewDesktop = func(ctx context.Context, slot int) (desktop.Desktop, error) {
		d, err := newDesktop(ctx, slot)
		if err != nil {
			return nil, err
		}
		c := countingDesktop{Desktop: d, evals: n}
		if rw, ok := d.(desktop.ReadyWaiter); ok {
			return countingReadyDesktop{c, rw}, nil
		}
		return c, nil
	}
	return n
}

type countingDesktop struct {
	desktop.Desktop
	evals *atomic.Int64
}

func (d countingDesktop) Evaluate(ctx context.Context, task Task) (float64, error) {
	r, err := d.Desktop.Evaluate(ctx, task)
	if err == nil {
		d.evals.Add(1)
	}
	return r, err
}

type countingReadyDesktop struct {
	countingDesktop
	rw desktop.ReadyWaiter
}

func (d countingReadyDesktop) WaitReady(ctx context.Context, max time.Duration) (desktop.Ready, error) {
	return d.rw.WaitReady(ctx, max)
}
