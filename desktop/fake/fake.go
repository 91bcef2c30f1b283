// Package fake is an in-memory desktop.Desktop: no VMs, deterministic from a
// seed, with scriptable latencies, rewards and faults, so that every path of
// the scheduler can be tested and benchmarked, and a trainer can be wired up
// before any VM exists.
//
// # Determinism
//
// Every random draw (a latency, a reward, a fault with a probability) is a
// function of the seed, what is drawn and a counter, never of the order of
// other draws. Which seed and counter depends on whether the call belongs
// to an attempt, which the scheduler says with desktop.WithAttempt in the
// call's ctx:
//
//   - In an attempt, draws are keyed by Config.Seed, the attempt (group,
//     task, index in the group, try) and the call's number of its phase
//     within the attempt. The reward is drawn once per attempt. So a batch
//     run with the same seed gets the same rewards, latencies and faults
//     whatever desktop runs each attempt: with 1 desktop or 8, and after a
//     kill and a resume.
//   - Outside an attempt (a ctx without one: the conformance suite, a
//     caller of its own), draws are keyed by the desktop's own seed (a
//     Fleet derives one per slot) and the call's number of its phase on the
//     desktop; the reward by how many times the desktop was reset to the
//     task. Reruns of the same calls on the same desktops repeat them.
//
// Fault.OnCall always counts calls per desktop. Screenshots are a function
// of the task ID, the Code actions since Reset and, while the screen
// settles, the number of Observe calls: two desktops given the same
// actions show the same images, whatever their seeds.
//
// # Time
//
// Latencies are waited with time.Timer in a select with the call's ctx and
// Close, so a call returns as soon as either is done. Under testing/synctest
// the waits use the bubble's fake clock: create the desktop inside the
// bubble, and a batch with minutes of latency runs in microseconds.
//
// # Screen
//
// Observe returns a real PNG (1920×1080 by default): a background chosen by
// the task, a window of coloured cells chosen by the action history, and,
// for Latency.Settle after a Reset or a Code action, a progress bar that
// advances on every Observe, so that a ready signal built on equal
// consecutive screenshots has real work to do.
//
// # Grading
//
// Evaluate follows OSWorld: an infeasible task (evaluator func
// "infeasible") scores 1 iff the last action since Reset was FAIL; a feasible
// task scores 0 after FAIL, its Reward's AtStart (0 unless set) when no
// action was taken since Reset, and otherwise what its Reward draws.
package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"legato/rl/desktop"
)

// Errors of injected faults and of misuse; all are desktop failures.
var (
	// ErrInjected is wrapped by the error of a FaultError.
	ErrInjected = errors.New("injected fault")
	// ErrCrashed is wrapped by the error of a FaultCrash and of every call
	// after it.
	ErrCrashed = errors.New("desktop crashed")
	// ErrNoTask is returned by the methods of an attempt (WaitAfterReset,
	// Observe, Act, WaitBeforeEval, Evaluate) called before a successful
	// Reset: the fake catches a scheduler that skips a
	// Reset.
	ErrNoTask = errors.New("no task: call Reset first")
)

var (
	_ desktop.Desktop        = (*Desktop)(nil)
	_ desktop.ReadyWaiter    = readyWaiter{}
	_ desktop.Stepper        = stepper{}
	_ desktop.Regrader       = (*Desktop)(nil)
	_ desktop.GradeExplainer = (*Desktop)(nil)
)

// Desktop is a fake desktop. Its methods keep the desktop.Desktop contract:
// they are not called concurrently, except Close, Stats and Name, which may
// be called at any time.
type Desktop struct {
	cfg  Config
	name string
	// seed keys the draws of calls outside an attempt; base, which is
	// Config.Seed, those of an attempt's calls.
	seed   uint64
	base   uint64
	width  int
	height int
	// closed is closed by the first Close; sleeps select on it.
	closed chan struct{}

	mu       sync.Mutex
	isClosed bool
	crashed  bool
	calls    [nPhases]int
	closes   int
	// inAttempt is the attempt of the last call whose ctx carried one, and
	// attemptCalls counts its calls per phase.
	inAttempt    desktop.Attempt
	hasAttempt   bool
	attemptCalls [nPhases]int
	resets       map[string]int // per task ID: successful Resets so far
	cur          attempt
	// lastGrade says which rule gave the last Evaluate's reward.
	lastGrade string

	// screens lends Observe a screen to render on; lastFrame and lastPNG
	// are the desktop's last screenshot, returned again while the screen
	// does not change. Observe is never concurrent with itself, so they
	// are not guarded by mu.
	screens   *screens
	lastFrame frame
	lastPNG   []byte
}

// attempt is what the desktop knows about the attempt since the last Reset.
type attempt struct {
	hasTask    bool
	task       string
	infeasible bool
	// n counts the earlier attempts at task on this desktop; the reward
	// is drawn from it.
	n int
	// taskHash and history give the screen (see frame).
	taskHash, history uint64
	last              desktop.Action
	acted             bool
	// target is a target task's target (see TargetFunc); empty for other
	// tasks. ptr follows the attempt's clicks.
	target      image.Rectangle
	ptr         pointer
	settleUntil time.Time
	tick        int
}

// New returns a fake desktop. It panics if cfg.Validate fails: a config is
// written by the test that uses it. NewFleet returns the error instead.
func New(cfg Config) *Desktop {
	if err := cfg.Validate(); err != nil {
		panic("fake.New: invalid config: " + err.Error())
	}
	name := cfg.Name
	if name == "" {
		name = "fake"
	}
	cfg.Rewards = maps.Clone(cfg.Rewards)
	cfg.Faults = slices.Clone(cfg.Faults)
	w, h := cfg.size()
	return newDesktop(cfg, name, cfg.Seed, newScreens(w, h, 1))
}

// newDesktop makes a desktop from a validated config it may keep.
func newDesktop(cfg Config, name string, seed uint64, screens *screens) *Desktop {
	w, h := cfg.size()
	return &Desktop{
		screens: screens,
		cfg:     cfg,
		name:    name,
		seed:    seed,
		base:    cfg.Seed,
		width:   w,
		height:  h,
		closed:  make(chan struct{}),
		resets:  make(map[string]int),
	}
}

// Name returns the name the desktop uses in its errors.
func (d *Desktop) Name() string { return d.name }

// Stats counts the calls made to a desktop, every call counted, failed ones
// too.
type Stats struct {
	Resets          int
	WaitAfterResets int
	Observes        int
	Acts            int
	WaitBeforeEvals int
	Evaluates       int
	WaitReadies     int
	Closes          int
}

func (s Stats) add(o Stats) Stats {
	return Stats{
		Resets:          s.Resets + o.Resets,
		WaitAfterResets: s.WaitAfterResets + o.WaitAfterResets,
		Observes:        s.Observes + o.Observes,
		Acts:            s.Acts + o.Acts,
		WaitBeforeEvals: s.WaitBeforeEvals + o.WaitBeforeEvals,
		Evaluates:       s.Evaluates + o.Evaluates,
		WaitReadies:     s.WaitReadies + o.WaitReadies,
		Closes:          s.Closes + o.Closes,
	}
}

// Stats returns the call counts so far. It is safe to call at any time.
func (d *Desktop) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	return Stats{
		Resets:          c[PhaseReset.index()],
		WaitAfterResets: c[PhaseWaitAfterReset.index()],
		Observes:        c[PhaseObserve.index()],
		Acts:            c[PhaseAct.index()],
		WaitBeforeEvals: c[PhaseWaitBeforeEval.index()],
		Evaluates:       c[PhaseEvaluate.index()],
		WaitReadies:     c[PhaseWaitReady.index()],
		Closes:          d.closes,
	}
}

// AsConfigured returns d as the scheduler should see it: a desktop.Desktop
// that also implements desktop.ReadyWaiter if Config.ReadyWaiter is set. (A
// *Desktop itself does not, so that a type assertion on it never finds a
// capability the config did not ask for.)
func (d *Desktop) AsConfigured() desktop.Desktop {
	switch {
	case d.cfg.ReadyWaiter && d.cfg.Stepper:
		return stepper{readyWaiter{d}}
	case d.cfg.ReadyWaiter:
		return readyWaiter{d}
	}
	return d
}

type readyWaiter struct{ *Desktop }

type stepper struct{ readyWaiter }

// Step acts, then waits until the screen settled (at most max) and looks
// once; a terminal action only acts.
func (s stepper) Step(ctx context.Context, a desktop.Action, max time.Duration) (desktop.StepResult, error) {
	start := time.Now()
	res, err := s.Act(ctx, a)
	actTime := time.Since(start)
	if err != nil || a.Terminal() {
		return desktop.StepResult{Act: res, ActTime: actTime}, err
	}
	waited, settled, err := s.waitReady(ctx, max)
	if err != nil {
		return desktop.StepResult{Act: res, ActTime: actTime}, err
	}
	t0 := time.Now()
	obs, err := s.Observe(ctx)
	if err != nil {
		return desktop.StepResult{Act: res, ActTime: actTime}, err
	}
	r := desktop.Ready{Observation: obs, After: waited, Settled: settled, Capture: time.Since(t0)}
	return desktop.StepResult{Act: res, Ready: r, ActTime: actTime, WaitTime: waited}, nil
}

// WaitReady waits until the screen has settled, at most max, and looks
// once.
func (r readyWaiter) WaitReady(ctx context.Context, max time.Duration) (desktop.Ready, error) {
	waited, settled, err := r.waitReady(ctx, max)
	if err != nil {
		return desktop.Ready{}, err
	}
	obs, err := r.Observe(ctx)
	if err != nil {
		return desktop.Ready{}, err
	}
	return desktop.Ready{Observation: obs, After: waited, Settled: settled}, nil
}

// Reset starts an attempt at task after Latency.Reset; the screen then
// settles for Latency.Settle.
func (d *Desktop) Reset(ctx context.Context, task desktop.Task) error {
	c, err := d.enter(ctx, PhaseReset, task.ID, false)
	if err != nil {
		return err
	}
	if err := d.sleep(ctx, d.latency(d.cfg.Latency.Reset, "reset", c)); err != nil {
		return d.fail(PhaseReset, err)
	}
	infeasible := isInfeasible(task.Evaluator)
	grid, isTarget, err := ParseTarget(task.Evaluator)
	if err != nil {
		return d.fail(PhaseReset, fmt.Errorf("task %q: %w: %v", task.ID, desktop.ErrUnsupported, err))
	}
	settle := d.latency(d.cfg.Latency.Settle, "settle after reset", c)
	h := hashKey(task.ID)

	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.resets[task.ID]
	d.cur = attempt{
		hasTask:     true,
		task:        task.ID,
		infeasible:  infeasible,
		n:           n,
		taskHash:    h,
		history:     h,
		settleUntil: time.Now().Add(settle),
	}
	if isTarget {
		d.cur.target = d.drawTarget(c, task.ID, n, grid)
	}
	d.resets[task.ID]++
	return nil
}

// drawTarget places a target task's target: one draw per attempt when c
// belongs to one (the same place on any desktop, after a resume, in a
// replay), else one per Reset of the desktop to the task.
func (d *Desktop) drawTarget(c drawKey, task string, n, grid int) image.Rectangle {
	cell := d.attemptDraw(c, "target", task, n).IntN(grid * grid)
	return targetRect(d.width, d.height, grid, cell%grid, cell/grid)
}

// WaitAfterReset takes Latency.WaitAfterReset, then waits for the screen to
// settle.
func (d *Desktop) WaitAfterReset(ctx context.Context) error {
	return d.waitSettled(ctx, PhaseWaitAfterReset, d.cfg.Latency.WaitAfterReset)
}

// WaitBeforeEval takes Latency.WaitBeforeEval, then waits for the screen to
// settle.
func (d *Desktop) WaitBeforeEval(ctx context.Context) error {
	return d.waitSettled(ctx, PhaseWaitBeforeEval, d.cfg.Latency.WaitBeforeEval)
}

func (d *Desktop) waitSettled(ctx context.Context, p Phase, l Latency) error {
	c, err := d.enter(ctx, p, "", true)
	if err != nil {
		return err
	}
	if err := d.sleep(ctx, d.latency(l, string(p), c)); err != nil {
		return d.fail(p, err)
	}
	d.mu.Lock()
	rest := time.Until(d.cur.settleUntil)
	d.mu.Unlock()
	if err := d.sleep(ctx, rest); err != nil {
		return d.fail(p, err)
	}
	return nil
}

// Observe takes Latency.Observe and returns the screen: a different frame
// on every call while the screen settles, the same one afterwards.
func (d *Desktop) Observe(ctx context.Context) (desktop.Observation, error) {
	c, err := d.enter(ctx, PhaseObserve, "", true)
	if err != nil {
		return desktop.Observation{}, err
	}
	if err := d.sleep(ctx, d.latency(d.cfg.Latency.Observe, "observe", c)); err != nil {
		return desktop.Observation{}, d.fail(PhaseObserve, err)
	}

	d.mu.Lock()
	now := time.Now()
	f := frame{task: d.cur.taskHash, history: d.cur.history, target: d.cur.target}
	if !d.cur.target.Empty() {
		f.clicked, f.click, f.hit = d.cur.ptr.clicked, d.cur.ptr.click, d.cur.hitTarget()
	}
	if now.Before(d.cur.settleUntil) {
		f.settling, f.tick = true, d.cur.tick
		d.cur.tick++
	}
	d.mu.Unlock()

	img, err := d.render(ctx, f)
	if err != nil {
		return desktop.Observation{}, d.fail(PhaseObserve, err)
	}
	return desktop.Observation{Screenshot: img, Width: d.width, Height: d.height, At: now}, nil
}

// render returns the PNG of f, the last one again when f did not change.
func (d *Desktop) render(ctx context.Context, f frame) ([]byte, error) {
	if d.lastPNG != nil && f == d.lastFrame {
		return bytes.Clone(d.lastPNG), nil
	}
	s, err := d.screens.get(ctx)
	if err != nil {
		return nil, err
	}
	img, err := s.png(f)
	d.screens.put(s)
	if err != nil {
		return nil, err
	}
	d.lastFrame, d.lastPNG = f, bytes.Clone(img)
	return img, nil
}

// Act takes Latency.Act and records the action. A Code action changes the
// screen, which then settles for Latency.Settle; every action succeeds in
// the guest (exit code 0).
func (d *Desktop) Act(ctx context.Context, action desktop.Action) (desktop.ActResult, error) {
	c, err := d.enter(ctx, PhaseAct, "", true)
	if err != nil {
		return desktop.ActResult{}, err
	}
	switch action.Kind {
	case desktop.Code, desktop.Wait, desktop.Done, desktop.Fail:
	default:
		return desktop.ActResult{}, d.fail(PhaseAct, fmt.Errorf("unknown action kind %d", action.Kind))
	}
	if err := d.sleep(ctx, d.latency(d.cfg.Latency.Act, "act", c)); err != nil {
		return desktop.ActResult{}, d.fail(PhaseAct, err)
	}
	settle := d.latency(d.cfg.Latency.Settle, "settle after act", c)

	d.mu.Lock()
	defer d.mu.Unlock()
	d.cur.last, d.cur.acted = action, true
	if action.Kind == desktop.Code {
		d.cur.ptr.follow(action.Code)
		d.cur.history = mix(d.cur.history ^ hashKey(action.Code))
		d.cur.settleUntil = time.Now().Add(settle)
		d.cur.tick = 0
	}
	return desktop.ActResult{}, nil
}

// Evaluate takes Latency.Evaluate and grades the attempt (see the package
// documentation). task must be the task of the last Reset.
func (d *Desktop) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	return d.evaluate(ctx, task, false)
}

// EvaluateAgain grades the attempt once more (desktop.Regrader) and takes
// Latency.Evaluate: the same reward as Evaluate, except for tasks whose
// Reward is Flaky, which draw again. task must be the task of the last
// Reset.
func (d *Desktop) EvaluateAgain(ctx context.Context, task desktop.Task) (float64, error) {
	return d.evaluate(ctx, task, true)
}

// evaluate is Evaluate, or with again EvaluateAgain.
func (d *Desktop) evaluate(ctx context.Context, task desktop.Task, again bool) (float64, error) {
	c, err := d.enter(ctx, PhaseEvaluate, task.ID, true)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	cur := d.cur
	d.mu.Unlock()
	if cur.task != task.ID {
		return 0, d.fail(PhaseEvaluate, fmt.Errorf("task %q, but the desktop was reset to task %q", task.ID, cur.task))
	}
	if err := d.sleep(ctx, d.latency(d.cfg.Latency.Evaluate, "evaluate", c)); err != nil {
		return 0, d.fail(PhaseEvaluate, err)
	}
	r, why := d.grade(cur, c, again)
	if !again {
		d.mu.Lock()
		d.lastGrade = why
		d.mu.Unlock()
	}
	return r, nil
}

// ExplainGrade says which rule gave the last Evaluate's reward
// (desktop.GradeExplainer).
func (d *Desktop) ExplainGrade() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastGrade
}

// grade scores the attempt a, graded by the call c, and says which rule
// gave the score; again says it is a second grade of the same end state.
func (d *Desktop) grade(a attempt, c drawKey, again bool) (float64, string) {
	lastFail := a.acted && a.last.Kind == desktop.Fail
	if a.infeasible {
		if lastFail {
			return 1, "fake: an infeasible task whose last action was FAIL"
		}
		return 0, "fake: an infeasible task whose last action was not FAIL"
	}
	if lastFail {
		return 0, "fake: the last action was FAIL"
	}
	if !a.target.Empty() {
		if a.hitTarget() {
			return 1, "fake: the first click hit the target"
		}
		return 0, "fake: the first click missed the target, or there was none"
	}
	r, ok := d.cfg.Rewards[a.task]
	if !ok {
		r = d.cfg.DefaultReward
	}
	if !a.acted && !(again && r.Flaky) {
		return r.AtStart, fmt.Sprintf("fake: task %q is set to score %v untouched (Reward.AtStart)", a.task, r.AtStart)
	}
	if r.P == 0 || d.rewardDraw(a, c, again && r.Flaky).Float64() >= r.P {
		return 0, fmt.Sprintf("fake: drew a failure (P %v)", r.P)
	}
	if r.Value == 0 {
		return 1, fmt.Sprintf("fake: drew a success (P %v)", r.P)
	}
	return r.Value, fmt.Sprintf("fake: drew a success worth %v (P %v)", r.Value, r.P)
}

// hitTarget reports whether the attempt's first click was inside its
// target.
func (a attempt) hitTarget() bool {
	return a.ptr.clicked && a.ptr.click.In(a.target)
}

// rewardDraw returns the generator of the reward of a, graded by the call
// c: one draw per attempt when c belongs to one, else one per Reset of the
// desktop to the task; redraw gives a second, independent one (a flaky
// grader's second grade).
func (d *Desktop) rewardDraw(a attempt, c drawKey, redraw bool) *rand.Rand {
	what := "reward"
	if redraw {
		what = "reward again"
	}
	return d.attemptDraw(c, what, a.task, a.n)
}

// attemptDraw returns the generator of a draw made once per attempt when the
// call c belongs to one, whatever call of the attempt draws it; else once
// per Reset of the desktop to task, the n-th.
func (d *Desktop) attemptDraw(c drawKey, what, task string, n int) *rand.Rand {
	if c.attempt != "" {
		return drawKey{seed: c.seed, attempt: c.attempt}.draw(what, "")
	}
	return draw(d.seed, what, task, n)
}

// isInfeasible reports whether an OSWorld evaluator is the "infeasible"
// one. A malformed evaluator is feasible: grading it is not the fake's job.
func isInfeasible(evaluator json.RawMessage) bool {
	var ev struct {
		Func json.RawMessage `json:"func"`
	}
	if json.Unmarshal(evaluator, &ev) != nil {
		return false
	}
	var f string
	return json.Unmarshal(ev.Func, &f) == nil && f == "infeasible"
}

// waitReady waits until the screen has settled, at most max, and reports
// how long it waited and whether the screen settled.
func (d *Desktop) waitReady(ctx context.Context, max time.Duration) (time.Duration, bool, error) {
	if _, err := d.enter(ctx, PhaseWaitReady, "", false); err != nil {
		return 0, false, err
	}
	start := time.Now()
	d.mu.Lock()
	rest := d.cur.settleUntil.Sub(start)
	d.mu.Unlock()
	if err := d.sleep(ctx, min(rest, max)); err != nil {
		return time.Since(start), false, d.fail(PhaseWaitReady, err)
	}
	return time.Since(start), rest <= max, nil
}

// Close makes every running call return and every later call fail with
// desktop.ErrClosed. It is idempotent and safe to call at any time.
func (d *Desktop) Close() error {
	d.mu.Lock()
	d.closes++
	first := !d.isClosed
	d.isClosed = true
	d.mu.Unlock()
	if first {
		close(d.closed)
	}
	return nil
}

// enter starts a call of phase p: it counts it, fails it if the desktop is
// closed, the ctx done, the desktop crashed, or (with needTask) no task was
// reset to, then injects the first fault that fires. task is the task the
// call is for; "" means the current one. It returns what the call's draws
// are keyed on (see the package documentation).
func (d *Desktop) enter(ctx context.Context, p Phase, task string, needTask bool) (drawKey, error) {
	att, inAttempt := desktop.AttemptFrom(ctx)
	d.mu.Lock()
	i := p.index()
	d.calls[i]++
	n := d.calls[i]
	c := drawKey{seed: d.seed, n: n}
	if inAttempt {
		if !d.hasAttempt || d.inAttempt != att {
			d.inAttempt, d.hasAttempt, d.attemptCalls = att, true, [nPhases]int{}
		}
		d.attemptCalls[i]++
		c = drawKey{seed: d.base, attempt: attemptKey(att), n: d.attemptCalls[i]}
	}
	closed, crashed, hasTask := d.isClosed, d.crashed, d.cur.hasTask
	if task == "" {
		task = d.cur.task
	}
	if p == PhaseReset {
		// Whatever happens next, the previous attempt is over.
		d.cur = attempt{}
	}
	d.mu.Unlock()

	switch {
	case closed:
		return c, d.fail(p, desktop.ErrClosed)
	case ctx.Err() != nil:
		return c, d.fail(p, ctx.Err())
	case crashed:
		return c, d.fail(p, ErrCrashed)
	case needTask && !hasTask:
		return c, d.fail(p, ErrNoTask)
	}
	f, ok := matchFault(d.cfg.Faults, c, d.name, p, n, task)
	if !ok {
		return c, nil
	}
	switch f.Kind {
	case FaultHang:
		return c, d.fail(p, d.hang(ctx))
	case FaultCrash:
		d.mu.Lock()
		d.crashed = true
		d.mu.Unlock()
		return c, d.fail(p, fmt.Errorf("%w on call %d", ErrCrashed, n))
	case FaultUnsupported:
		return c, d.fail(p, unsupported(task, n))
	}
	return c, d.fail(p, fmt.Errorf("%w on call %d", ErrInjected, n))
}

func unsupported(task string, n int) error {
	return fmt.Errorf("task %q: %w (injected on call %d)", task, desktop.ErrUnsupported, n)
}

// matchFault returns the first of faults that fires on the n-th call of p
// for task on the desktop named name, drawing probabilities with c.
func matchFault(faults []Fault, c drawKey, name string, p Phase, n int, task string) (Fault, bool) {
	for i, f := range faults {
		if f.Phase != p || (f.Desktop != "" && f.Desktop != name) || (f.Task != "" && f.Task != task) {
			continue
		}
		if f.OnCall == n || (f.Prob > 0 && c.draw("fault", strconv.Itoa(i)).Float64() < f.Prob) {
			return f, true
		}
	}
	return Fault{}, false
}

func (d *Desktop) fail(p Phase, err error) error {
	return &desktop.Error{Op: string(p), Desktop: d.name, Err: err}
}

func (d *Desktop) latency(l Latency, what string, c drawKey) time.Duration {
	if l == (Latency{}) {
		return 0
	}
	return l.Sample(c.draw("latency", what))
}

// sleep waits for dur, or until ctx is done or the desktop closed. Not
// backoff.Sleep: Close must end a call in flight (the contract), and the
// call's ctx does not end on Close.
func (d *Desktop) sleep(ctx context.Context, dur time.Duration) error {
	if dur <= 0 {
		return nil
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.closed:
		return desktop.ErrClosed
	}
}

// hang waits until ctx is done or the desktop closed.
func (d *Desktop) hang(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-d.closed:
		return desktop.ErrClosed
	}
}
