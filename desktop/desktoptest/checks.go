package desktoptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"sync"
	"time"

	"go.uber.org/goleak"

	"legato/rl/desktop"
)

// check is one conformance check. run records problems with c.errorf and
// returns early when the desktop is too broken to go on.
type check struct {
	name string
	run  func(c *checker)
}

func checks() []check {
	cs := []check{
		{"Observe/AfterReset", (*checker).observeAfterReset},
		{"Act/EveryKind", (*checker).everyKind},
		{"Step/LikeActThenWait", (*checker).step},
		{"Evaluate/Range", (*checker).evaluateRange},
		{"Evaluate/Infeasible", (*checker).infeasible},
	}
	for _, m := range methods() {
		cs = append(cs, check{"Cancel/Before/" + string(m), func(c *checker) { c.cancelBefore(m) }})
	}
	for _, m := range methods() {
		cs = append(cs, check{"Cancel/During/" + string(m), func(c *checker) { c.interrupt(m, false) }})
	}
	cs = append(cs,
		check{"Close/Twice", (*checker).closeTwice},
		check{"Close/Concurrent", (*checker).closeConcurrent},
		check{"Close/MethodsAfter", (*checker).methodsAfterClose},
	)
	for _, m := range methods() {
		cs = append(cs, check{"Close/During/" + string(m), func(c *checker) { c.interrupt(m, true) }})
	}
	return cs
}

// checker is the state of one check: the desktops it made (closed when it
// ends) and the calls it started in goroutines (waited for when it ends).
type checker struct {
	ctx        context.Context
	opts       Options
	newDesktop func(context.Context) (desktop.Desktop, error)
	desktops   []desktop.Desktop
	calls      []*pendingCall
	errs       []error
}

func (c *checker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// runCheck runs ch, closes its desktops, waits for its calls and looks for
// goroutines left behind.
func runCheck(ctx context.Context, ch check, newDesktop func(context.Context) (desktop.Desktop, error), opts Options) []error {
	var before goleak.Option
	if !opts.SkipLeakCheck {
		before = goleak.IgnoreCurrent()
	}
	c := &checker{ctx: ctx, opts: opts, newDesktop: newDesktop}
	ch.run(c)
	if c.cleanup() && !opts.SkipLeakCheck {
		if err := goleak.Find(before); err != nil {
			c.errorf("goroutines still running after every desktop was closed: %v", err)
		}
	}
	return c.errs
}

// cleanup closes every desktop of the check and waits for every call it
// started. It reports whether they all returned. A call that outlives both
// its ctx and Close by Bound is reported and abandoned: nothing else can stop
// it.
func (c *checker) cleanup() bool {
	for _, d := range c.desktops {
		// Close errors of desktops the check closed already are the Close
		// checks' business; here only a Close that hangs matters.
		c.start("Close", d.Close)
	}
	all := true
	for _, p := range c.calls {
		if !p.wait(c.opts.Bound) {
			c.errorf("%s still running %v after its ctx was cancelled and its desktop closed; abandoned", p.what, c.opts.Bound)
			all = false
		}
	}
	return all
}

// pendingCall is a call running in a goroutine of its own, so that a check
// can give up waiting for it.
type pendingCall struct {
	what     string
	done     chan error
	returned bool
	err      error
}

func (c *checker) start(what string, fn func() error) *pendingCall {
	p := &pendingCall{what: what, done: make(chan error, 1)}
	c.calls = append(c.calls, p)
	go func() { p.done <- fn() }()
	return p
}

// wait waits up to d for p to return, and reports whether it did; p.err is
// then its error.
func (p *pendingCall) wait(d time.Duration) bool {
	if p.returned {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case p.err = <-p.done:
		p.returned = true
		return true
	case <-t.C:
		return false
	}
}

func (c *checker) desktop() desktop.Desktop {
	d, err := c.newDesktop(c.ctx)
	if err != nil {
		c.errorf("new desktop: %v", err)
		return nil
	}
	c.desktops = append(c.desktops, d)
	return d
}

func (c *checker) blockingDesktop(m Method) desktop.Desktop {
	if c.opts.Blocking == nil {
		return c.desktop()
	}
	d, err := c.opts.Blocking(c.ctx, m)
	if err != nil {
		c.errorf("Options.Blocking(%s): %v", m, err)
		return nil
	}
	c.desktops = append(c.desktops, d)
	return d
}

func (c *checker) task() desktop.Task { return c.opts.Tasks[0] }

// call calls method m of d; act is the action of Act.
func (c *checker) call(ctx context.Context, d desktop.Desktop, m Method, act desktop.Action) error {
	switch m {
	case MethodReset:
		return d.Reset(ctx, c.task())
	case MethodWaitAfterReset:
		return d.WaitAfterReset(ctx)
	case MethodObserve:
		_, err := d.Observe(ctx)
		return err
	case MethodAct:
		_, err := d.Act(ctx, act)
		return err
	case MethodWaitBeforeEval:
		return d.WaitBeforeEval(ctx)
	case MethodEvaluate:
		_, err := d.Evaluate(ctx, c.task())
		return err
	}
	panic("desktoptest: unknown method " + string(m))
}

// prepare runs the calls of an attempt that come before m (acting DONE), so
// that m is the next call.
func (c *checker) prepare(d desktop.Desktop, m Method) bool {
	for _, prev := range methods() {
		if prev == m {
			return true
		}
		if err := c.call(c.ctx, d, prev, desktop.DoneAction); err != nil {
			c.errorf("preparing %s: %s: %v", m, prev, err)
			return false
		}
	}
	return true
}

// actionFor returns the action to try when m is Act.
func (c *checker) actionFor() desktop.Action { return c.opts.Actions[0] }

func (c *checker) observeAfterReset() {
	d := c.desktop()
	if d == nil {
		return
	}
	for _, task := range c.opts.Tasks {
		if err := d.Reset(c.ctx, task); err != nil {
			c.errorf("Reset(%q): %v", task.ID, err)
			return
		}
		if err := d.WaitAfterReset(c.ctx); err != nil {
			c.errorf("task %q: WaitAfterReset: %v", task.ID, err)
			return
		}
		obs, err := d.Observe(c.ctx)
		if err != nil {
			c.errorf("task %q: Observe: %v", task.ID, err)
			return
		}
		if err := c.checkObservation(obs); err != nil {
			c.errorf("task %q: Observe after reset: %v", task.ID, err)
		}
	}
}

// checkObservation reports what is wrong with obs.
func (c *checker) checkObservation(obs desktop.Observation) error {
	if obs.Width <= 0 || obs.Height <= 0 {
		return fmt.Errorf("Observation declares a %d×%d screen", obs.Width, obs.Height)
	}
	if c.opts.Width > 0 && obs.Width != c.opts.Width || c.opts.Height > 0 && obs.Height != c.opts.Height {
		return fmt.Errorf("Observation declares a %d×%d screen, want %d×%d (Options)", obs.Width, obs.Height, c.opts.Width, c.opts.Height)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(obs.Screenshot))
	if err != nil {
		return fmt.Errorf("screenshot (%d bytes) is not a PNG: %v", len(obs.Screenshot), err)
	}
	if cfg.Width != obs.Width || cfg.Height != obs.Height {
		return fmt.Errorf("screenshot is %d×%d, but Observation declares %d×%d", cfg.Width, cfg.Height, obs.Width, obs.Height)
	}
	if _, err := png.Decode(bytes.NewReader(obs.Screenshot)); err != nil {
		return fmt.Errorf("screenshot does not decode: %v", err)
	}
	if obs.At.IsZero() {
		return errors.New("Observation.At is zero")
	}
	return nil
}

// step runs the options' Code actions, then WAIT and DONE, through Step,
// for a desktop that implements desktop.Stepper: each Code action's step
// and WAIT's return the screen to continue from, within the wait's bound,
// with an action and a wait time that fit in the call; DONE returns no
// screen. A desktop without Step passes.
func (c *checker) step() {
	d := c.desktop()
	if d == nil {
		return
	}
	st, ok := d.(desktop.Stepper)
	if !ok || !c.prepare(d, MethodAct) {
		return
	}
	const bound = 10 * time.Second
	for _, a := range c.opts.Actions {
		t0 := time.Now()
		res, err := st.Step(c.ctx, a, bound)
		took := time.Since(t0)
		if err != nil {
			c.errorf("Step(%q): %v", a, err)
			return
		}
		if err := c.checkObservation(res.Ready.Observation); err != nil {
			c.errorf("Step(%q): %v", a, err)
		}
		if res.ActTime < 0 || res.WaitTime < 0 || res.ActTime+res.WaitTime > took {
			c.errorf("Step(%q): act %v and wait %v do not fit in the call's %v", a, res.ActTime, res.WaitTime, took)
		}
		if res.Ready.After > bound+c.opts.Bound {
			c.errorf("Step(%q): ready after %v, past the bound %v", a, res.Ready.After, bound)
		}
	}
	res, err := st.Step(c.ctx, desktop.WaitAction, bound)
	if err != nil {
		c.errorf("Step(WAIT): %v", err)
		return
	}
	if err := c.checkObservation(res.Ready.Observation); err != nil {
		c.errorf("Step(WAIT): %v: WAIT is the wait alone, and the screen it ends on", err)
	}
	res, err = st.Step(c.ctx, desktop.DoneAction, bound)
	if err != nil {
		c.errorf("Step(DONE): %v", err)
	} else if res.Ready.Observation.Screenshot != nil {
		c.errorf("Step(DONE) returned a screen: a terminal action only counts as the attempt's last")
	}
}

// everyKind runs an attempt with every Code action of the options, then
// WAIT and DONE, observing after each, and a second attempt ending in FAIL.
func (c *checker) everyKind() {
	d := c.desktop()
	if d == nil || !c.prepare(d, MethodAct) {
		return
	}
	for _, a := range append(c.opts.Actions, desktop.WaitAction, desktop.DoneAction) {
		if _, err := d.Act(c.ctx, a); err != nil {
			c.errorf("Act(%q): %v", a, err)
			return
		}
		obs, err := d.Observe(c.ctx)
		if err != nil {
			c.errorf("Observe after Act(%q): %v", a, err)
			return
		}
		if err := c.checkObservation(obs); err != nil {
			c.errorf("Observe after Act(%q): %v", a, err)
		}
	}
	if !c.prepare(d, MethodAct) {
		return
	}
	if _, err := d.Act(c.ctx, desktop.FailAction); err != nil {
		c.errorf("Act(%q): %v", desktop.FailAction, err)
	}
}

// attempt runs one attempt at task with actions and returns its reward.
func (c *checker) attempt(d desktop.Desktop, task desktop.Task, actions ...desktop.Action) (float64, error) {
	if err := d.Reset(c.ctx, task); err != nil {
		return 0, fmt.Errorf("Reset(%q): %w", task.ID, err)
	}
	if err := d.WaitAfterReset(c.ctx); err != nil {
		return 0, fmt.Errorf("WaitAfterReset: %w", err)
	}
	if _, err := d.Observe(c.ctx); err != nil {
		return 0, fmt.Errorf("Observe: %w", err)
	}
	for _, a := range actions {
		if _, err := d.Act(c.ctx, a); err != nil {
			return 0, fmt.Errorf("Act(%q): %w", a, err)
		}
	}
	if err := d.WaitBeforeEval(c.ctx); err != nil {
		return 0, fmt.Errorf("WaitBeforeEval: %w", err)
	}
	r, err := d.Evaluate(c.ctx, task)
	if err != nil {
		return 0, fmt.Errorf("Evaluate(%q): %w", task.ID, err)
	}
	return r, nil
}

// evaluateRange grades an attempt ending in DONE and one ending in FAIL at
// every task.
func (c *checker) evaluateRange() {
	d := c.desktop()
	if d == nil {
		return
	}
	for _, task := range c.opts.Tasks {
		for _, last := range []desktop.Action{desktop.DoneAction, desktop.FailAction} {
			r, err := c.attempt(d, task, c.actionFor(), last)
			if err != nil {
				c.errorf("task %q, attempt ending in %v: %v", task.ID, last, err)
				return
			}
			if !(r >= 0 && r <= 1) {
				c.errorf("task %q, attempt ending in %v: reward %v is outside [0, 1]", task.ID, last, r)
			}
		}
	}
}

// infeasible checks OSWorld's semantics on the infeasible tasks among the
// options' (the default task is one): 1 iff the last action since Reset was
// FAIL. The DONE attempt follows the FAIL one, so a desktop that forgets to
// clear its history on Reset fails too.
func (c *checker) infeasible() {
	var d desktop.Desktop
	for _, task := range c.opts.Tasks {
		if !isInfeasible(task.Evaluator) {
			continue
		}
		if d == nil {
			if d = c.desktop(); d == nil {
				return
			}
		}
		for _, tc := range []struct {
			actions []desktop.Action
			want    float64
		}{
			{[]desktop.Action{c.actionFor(), desktop.FailAction}, 1},
			{[]desktop.Action{c.actionFor(), desktop.DoneAction}, 0},
		} {
			r, err := c.attempt(d, task, tc.actions...)
			if err != nil {
				c.errorf("infeasible task %q: %v", task.ID, err)
				return
			}
			if r != tc.want {
				c.errorf("infeasible task %q, actions %v: reward %v, want %v", task.ID, tc.actions, r, tc.want)
			}
		}
	}
}

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

// cancelBefore calls m with a ctx cancelled before the call.
func (c *checker) cancelBefore(m Method) {
	d := c.desktop()
	if d == nil || !c.prepare(d, m) {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	cancel()
	p := c.start(string(m), func() error { return c.call(ctx, d, m, c.actionFor()) })
	if !p.wait(c.opts.Bound) {
		c.errorf("%s with a cancelled ctx did not return within %v", m, c.opts.Bound)
		return
	}
	if p.err != nil && !errors.Is(p.err, context.Canceled) {
		c.errorf("%s with a cancelled ctx returned %v, which does not wrap context.Canceled", m, p.err)
	}
}

// watchedCtx tells when the desktop first asks for Done: the call is then
// running and looking at its ctx.
type watchedCtx struct {
	context.Context
	entered chan struct{}
	once    sync.Once
}

func (w *watchedCtx) Done() <-chan struct{} {
	w.once.Do(func() { close(w.entered) })
	return w.Context.Done()
}

// interrupt calls m and, once it runs, cancels its ctx or (byClose) closes
// the desktop; the call must return within Bound.
func (c *checker) interrupt(m Method, byClose bool) {
	d := c.blockingDesktop(m)
	if d == nil || !c.prepare(d, m) {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	w := &watchedCtx{Context: ctx, entered: make(chan struct{})}
	p := c.start(string(m), func() error { return c.call(w, d, m, c.actionFor()) })

	t := time.NewTimer(c.opts.Bound)
	select {
	case <-w.entered:
	case p.err = <-p.done:
		p.returned = true
		if c.opts.Blocking != nil {
			c.errorf("%s returned (error %v) before it could be interrupted, but the desktop from Options.Blocking should block in it", m, p.err)
		}
		// Too fast to interrupt: nothing to check.
		t.Stop()
		return
	case <-t.C:
		// The call neither returned nor looked at its ctx yet:
		// interrupt it anyway.
	}
	t.Stop()

	if byClose {
		closed := c.start("Close", d.Close)
		if !p.wait(c.opts.Bound) {
			c.errorf("%s did not return within %v after Close", m, c.opts.Bound)
		}
		if !closed.wait(c.opts.Bound) {
			c.errorf("Close did not return within %v while %s was running", c.opts.Bound, m)
		} else if closed.err != nil {
			c.errorf("Close while %s was running: %v", m, closed.err)
		}
		return
	}
	cancel()
	if !p.wait(c.opts.Bound) {
		c.errorf("%s did not return within %v after its ctx was cancelled", m, c.opts.Bound)
		return
	}
	switch {
	case p.err == nil && c.opts.Blocking != nil:
		c.errorf("%s returned nil after its ctx was cancelled, want an error wrapping context.Canceled", m)
	case p.err != nil && !errors.Is(p.err, context.Canceled):
		c.errorf("%s returned %v after its ctx was cancelled, which does not wrap context.Canceled", m, p.err)
	}
}

// closeBounded closes d and reports a Close that fails or hangs.
func (c *checker) closeBounded(d desktop.Desktop, which string) {
	p := c.start("Close", d.Close)
	if !p.wait(c.opts.Bound) {
		c.errorf("%s Close did not return within %v", which, c.opts.Bound)
	} else if p.err != nil {
		c.errorf("%s Close returned %v", which, p.err)
	}
}

// closeTwice closes a desktop that was never used, twice.
func (c *checker) closeTwice() {
	d := c.desktop()
	if d == nil {
		return
	}
	c.closeBounded(d, "first")
	c.closeBounded(d, "second")
}

// closeConcurrent closes a desktop in the middle of an attempt from two
// goroutines at once (the race detector watches).
func (c *checker) closeConcurrent() {
	d := c.desktop()
	if d == nil || !c.prepare(d, MethodAct) {
		return
	}
	a, b := c.start("Close", d.Close), c.start("Close", d.Close)
	for _, p := range []*pendingCall{a, b} {
		if !p.wait(c.opts.Bound) {
			c.errorf("concurrent Close did not return within %v", c.opts.Bound)
		} else if p.err != nil {
			c.errorf("concurrent Close: %v", p.err)
		}
	}
}

// methodsAfterClose calls every method after Close; each must fail with
// desktop.ErrClosed.
func (c *checker) methodsAfterClose() {
	d := c.desktop()
	if d == nil || !c.prepare(d, MethodAct) {
		return
	}
	c.closeBounded(d, "the")
	for _, m := range methods() {
		p := c.start(string(m), func() error { return c.call(c.ctx, d, m, c.actionFor()) })
		switch {
		case !p.wait(c.opts.Bound):
			c.errorf("%s after Close did not return within %v", m, c.opts.Bound)
		case !errors.Is(p.err, desktop.ErrClosed):
			c.errorf("%s after Close returned %v, want an error wrapping desktop.ErrClosed", m, p.err)
		}
	}
}
