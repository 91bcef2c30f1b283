package osworld

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/setup"
	"legato/rl/desktop/osworld/vm"
)

var (
	_ desktop.Desktop     = (*Desktop)(nil)
	_ desktop.ReadyWaiter = (*Desktop)(nil)
)

// ResetReport says what the last Reset did, why, and how long its parts
// took.
type ResetReport struct {
	TaskID string
	// Kind is ResetNone, ResetFast, ResetLoadvm, ResetRevert,
	// ResetFastThenLoadvm, ResetFastThenRevert, ResetFastIncomplete,
	// ResetGolden, ResetGoldenFork or ResetGoldenBuild.
	Kind string
	// Why says why that reset: the rule or the measured costs that chose
	// it, and for a fallback what the fast reset could not undo.
	Why string
	// Restore is the time to the clean state: the fast reset with its
	// checks, or the revert until the guest answered and its clock was
	// set (both for a fallback).
	Restore time.Duration
	// Setup is the time the task's setup steps took.
	Setup time.Duration
	// Golden is the time taking the task's golden state took (for
	// ResetGoldenBuild): the wait for a settled screen and the snapshot.
	Golden time.Duration
	// Ended names the processes a fast reset ended, Spared those started
	// since the clean state it left running as not the desktop user's;
	// Closed the windows it closed; Left says what it could not undo.
	Ended, Spared []desktop.Process
	Closed, Left  []string
}

// Desktop is one OSWorld guest, driven through its guest server: a VM this
// process started (see VMDesktop) or a guest that runs elsewhere. It
// implements desktop.Desktop and desktop.ReadyWaiter. Its methods follow the contract of package
// desktop: no two run at once, except Close.
type Desktop struct {
	name   string
	cfg    Config
	vm     *vm.VM // nil for a guest given by URL
	guest  *guest.Client
	sh     *guestShell
	setup  *setup.Controller
	grader *grade.Grader
	log    *slog.Logger
	tmpDir string
	// host names the VM's host ("" for a guest given by URL); fwd are the
	// grader's forwards to a remote host's guest ports.
	host string
	fwd  forwards
	// release tells the pool the desktop is gone.
	release func()

	closeCtx  context.Context
	closeNow  context.CancelFunc
	closeOnce sync.Once
	closeErr  error

	// Attempt state, used only by the (sequential) methods.
	lastAction desktop.Action
	fresh      bool            // nothing ran since the clean snapshot
	warned     map[string]bool // domains warned about (guests without snapshots)
	noLoad     bool            // the guest's load cannot be measured
	noDamage   bool            // the guest cannot watch its screen
	exec       executor        // the attempt's action executor (executor.go)
	waits      waitCosts
	chooser    resetChooser
	prev       prevAttempt // the attempt since the last reset
	golden     goldenSet
	fork       forkState
	forks      *forkTemplates // the pool's; nil without Golden.Fork
	// probe is the VM's readiness probe, which measures the guest clock's
	// offset when the guest answers after a revert; nil for a guest given
	// by URL.
	probe *vmPrep

	mu          sync.Mutex // guards lastReset, lastGrading and execDir
	lastReset   ResetReport
	lastGrading []desktop.MetricRun // how the last Evaluate's metrics ran
	execDir     string              // the last executor's directory, for Close
}

// VMDesktop is a Desktop on a VM this process started. It adds Revert.
type VMDesktop struct {
	*Desktop
}

// Revert restores the VM's clean snapshot, then sets the guest clock,
// which the snapshot turned back. It does not run any task's setup.
func (d *VMDesktop) Revert(ctx context.Context) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.fresh = false
	d.lastAction = desktop.Action{}
	d.prev = prevAttempt{}
	d.exec = executor{} // the snapshot has none
	if err := d.endClone(ctx, false); err != nil {
		return d.fail("revert", err)
	}
	d.fork.unparked = false
	if _, err := d.revert(ctx); err != nil {
		return d.fail("revert", err)
	}
	return nil
}

// VM returns the VM the desktop runs on.
func (d *VMDesktop) VM() *vm.VM { return d.vm }

// Name names the desktop: the VM's domain name, or the guest's URL.
func (d *Desktop) Name() string { return d.name }

// Guest returns the client of the desktop's guest server.
func (d *Desktop) Guest() *guest.Client { return d.guest }

// LastReset reports what the last Reset did.
func (d *Desktop) LastReset() ResetReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastReset
}

// begin starts a method: it refuses to run after Close or with a done ctx,
// and returns a ctx that Close cancels too.
func (d *Desktop) begin(ctx context.Context) (context.Context, func(), error) {
	if d.closeCtx.Err() != nil {
		return nil, nil, &desktop.Error{Op: "call", Desktop: d.name, Err: desktop.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(d.closeCtx, func() { cancel(desktop.ErrClosed) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
		// A call that Close interrupted may hand its connection back to
		// the idle pool after Close emptied it; empty it again so no
		// connection (and its goroutines) outlives the desktop.
		if d.closeCtx.Err() != nil {
			d.guest.CloseIdleConnections()
		}
	}, nil
}

// fail wraps a method's error as a *desktop.Error. Unsupported tasks and
// the caller's cancellation keep their sentinels through the wrapping; an
// error caused by Close says so.
func (d *Desktop) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	if d.closeCtx.Err() != nil && !errors.Is(err, desktop.ErrClosed) {
		err = fmt.Errorf("%w: %w", desktop.ErrClosed, err)
	}
	return &desktop.Error{Op: op, Desktop: d.name, Err: err}
}

// Reset brings the desktop to the task's initial state, then runs the
// task's setup steps. On a VM, a task's golden state (see GoldenConfig)
// comes first: loaded when this desktop has one, else taken after this
// reset's setup. Otherwise it chooses between a fast reset and loading the
// clean snapshot (see resetChooser): the snapshot for NoFastReset, for
// tasks of RevertDomains and the attempt after one, and after a task whose
// attempt a fast reset could not undo before; otherwise whichever measured
// cheaper on this desktop. A golden state that does not load falls back to
// the clean snapshot (one taken for another key is taken again after a
// reset of that choice), a fast reset that cannot bring the guest back to
// the snapshot, and a loadvm that fails to libvirt's revert. A guest given by
// URL can only fast-reset. LastReset says which reset ran and why.
func (d *Desktop) Reset(ctx context.Context, task desktop.Task) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.lastAction = desktop.Action{}
	d.mu.Lock()
	d.lastGrading = nil
	d.mu.Unlock()
	if err := d.checkTask(task); err != nil {
		return d.fail("reset", err)
	}
	prev, cur := d.prev, prevAttempt{id: task.ID, domain: task.Domain}
	gp := d.goldenPlan(ctx, task)
	// The last attempt's clone goes; the VM takes its ports back unless
	// another clone follows.
	if err := d.endClone(ctx, gp.state != nil && d.forking(gp.key)); err != nil {
		return d.fail("reset", err)
	}
	if gp.state != nil {
		// Whatever the load does, the guest no longer holds the last
		// attempt as it was.
		d.prev = cur
		rep, err := d.resetGolden(ctx, task, &gp)
		if err != nil {
			return d.fail("reset ("+ResetGolden+")", err)
		}
		if rep != nil {
			d.fresh = false
			d.fork.unparked = false
			d.prev = cur
			d.resumeExecutor(ctx, gp.execDir)
			d.setLastReset(*rep)
			return nil
		}
	}
	c := d.choose(cur, prev)
	if gp.build && !d.fresh && d.vm != nil {
		// A fast reset restores files, not what running programs hold
		// (clipboard, window manager, caches): every attempt from the
		// golden state would inherit that.
		c = choice{ResetLoadvm, "a golden state is taken from the clean snapshot"}
	}
	if d.fork.unparked {
		// The VM waited paused while clones ran: it holds what it held
		// before them, which the last attempt does not describe.
		c = choice{ResetLoadvm, "the VM held an earlier attempt while clones ran: the clean snapshot brings it back"}
	}
	if gp.loadFailed {
		// The failed load may have left the guest anywhere: only the
		// clean snapshot brings it back.
		c = choice{ResetLoadvm, "a failed load leaves the guest anywhere: the clean snapshot brings it back"}
	}
	d.fresh = false
	// From here on the desktop holds this task's attempt (or a reset that
	// failed on the way to it): the next reset undoes that.
	d.prev = cur
	rep := ResetReport{TaskID: task.ID, Kind: c.kind, Why: c.why}
	d.exec = executor{} // the reset ends it
	t0 := time.Now()
	switch c.kind {
	case ResetLoadvm:
		rep.Kind, err = d.revert(ctx)
	case ResetFast:
		var r cleanResult
		r, err = d.fastReset(ctx)
		rep.Ended, rep.Spared, rep.Closed, rep.Left = r.Ended, r.Spared, r.Windows.Closed, append(r.Broken, r.Problems...)
		for _, p := range r.Ended {
			d.log.Info("fast reset ended a process of the last attempt", "task", task.ID, "pid", p.PID, "name", p.Name, "uid", p.UID)
		}
		d.log.Debug("fast reset in the guest", "seconds", r.Seconds, "restored", r.Restored)
		if err != nil && errors.Is(err, ErrFastReset) {
			left := strings.Join(rep.Left, "; ")
			if left == "" {
				left = err.Error()
			}
			if d.vm == nil && errors.Is(err, errLeft) {
				d.log.Warn("the fast reset could not undo all of the last attempt, and a guest given by URL has no snapshot to fall back to: this attempt starts from what is left",
					"task", task.ID, "left", left)
				rep.Kind, rep.Why, err = ResetFastIncomplete, c.why+"; left of the earlier attempt: "+left, nil
				break
			}
			if d.vm == nil {
				break
			}
			d.log.Info("fast reset could not undo the last attempt; restoring the snapshot", "task", task.ID, "after_task", prev.id, "left", left)
			var how string
			how, err = d.revert(ctx)
			rep.Kind = ResetFast + "+" + how
			rep.Why = c.why + "; fell back to the snapshot: " + left
			d.chooser.done(rep.Kind, time.Since(t0), prev, left)
		}
	}
	if err != nil {
		return d.fail("reset ("+rep.Kind+")", err)
	}
	rep.Restore = time.Since(t0)
	if c.kind == ResetLoadvm {
		d.fork.unparked = false
	}
	if d.vm != nil && c.kind != ResetNone && rep.Kind != ResetFastThenLoadvm && rep.Kind != ResetFastThenRevert {
		d.chooser.done(rep.Kind, rep.Restore, prev, "")
	}
	if gp.why != "" && !gp.build {
		rep.Why = gp.why + "; " + rep.Why
	}
	t1 := time.Now()
	d.startExecutor(ctx)
	if err := d.setup.Run(ctx, task, task.Setup); err != nil {
		return d.fail("setup", err)
	}
	rep.Setup = time.Since(t1)
	if gp.build {
		t2 := time.Now()
		_, err := d.buildGolden(ctx, task, gp.key, gp.id, rep.Setup)
		switch {
		case err == nil:
			rep.Why = fmt.Sprintf("%s (reset: %s, %s)", gp.why, rep.Kind, rep.Why)
			rep.Kind = ResetGoldenBuild
			rep.Golden = time.Since(t2)
		case ctx.Err() != nil:
			return d.fail("reset ("+ResetGoldenBuild+")", err)
		default:
			// The attempt goes on from the state the setup left; the task
			// resets as without golden states on this desktop.
			d.log.Warn("could not take the task's golden state; its attempts reset and run its setup instead", "task", task.ID, "err", err)
			d.golden.markBroken(task.ID, "taking its golden state failed: "+err.Error())
			rep.Why = fmt.Sprintf("%s; %s; taking the golden state failed: %s", gp.why, rep.Why, clip(err.Error()))
		}
	}
	d.setLastReset(rep)
	d.log.Debug("reset", "task", task.ID, "kind", rep.Kind, "why", rep.Why, "restore", rep.Restore, "setup", rep.Setup, "golden", rep.Golden, "ended", rep.Ended, "closed", rep.Closed)
	return nil
}

func (d *Desktop) setLastReset(rep ResetReport) {
	d.mu.Lock()
	d.lastReset = rep
	d.mu.Unlock()
}

// choose picks the reset before task; prev is the attempt since the last
// reset.
func (d *Desktop) choose(task, prev prevAttempt) choice {
	if d.vm == nil {
		if (d.cfg.NoFastReset || d.cfg.revertDomain(task.domain)) && !d.warned[task.domain] {
			d.warned[task.domain] = true
			d.log.Warn("this task needs a snapshot revert, which a guest given by URL cannot do: fast-resetting it, so state the fast reset does not restore may carry over between attempts",
				"domain", task.domain, "task", task.id, "guest", d.name)
		}
		return choice{ResetFast, "a guest given by URL has no snapshot"}
	}
	if d.fresh {
		return choice{ResetNone, "the VM was just made from its clean snapshot"}
	}
	return d.chooser.choose(d.cfg, task, prev)
}

// checkTask refuses what this desktop cannot set up, before touching it.
func (d *Desktop) checkTask(task desktop.Task) error {
	return checkBrowser(task, d.setup.Browser != nil)
}

// checkBrowser refuses a task with chrome_* setup steps on a desktop
// without a DevTools endpoint.
func checkBrowser(task desktop.Task, haveBrowser bool) error {
	if haveBrowser {
		return nil
	}
	for _, s := range task.Setup {
		switch s.Type {
		case "chrome_open_tabs", "chrome_close_tabs":
			return fmt.Errorf("task %s: setup step %s needs the guest's Chrome DevTools port, which this desktop lacks (give --guest-url URL,devtools=PORT): %w",
				task.ID, s.Type, desktop.ErrUnsupported)
		}
	}
	return nil
}

// fastReset brings the guest back to its recorded clean state.
func (d *Desktop) fastReset(ctx context.Context) (cleanResult, error) {
	cfg, err := d.cfg.cleanConfig()
	if err != nil {
		return cleanResult{}, err
	}
	return d.sh.resetClean(ctx, cfg)
}

// revert restores the VM's clean snapshot and thaws the guest (see
// restore). It returns the kind of reset that ran: ResetLoadvm, or
// ResetRevert when loadvm failed.
func (d *Desktop) revert(ctx context.Context) (string, error) {
	if d.vm == nil {
		return "", fmt.Errorf("revert: a guest given by URL has no snapshot: %w", desktop.ErrUnsupported)
	}
	return d.restore(ctx, func(ctx context.Context) (string, error) {
		err := d.vm.Revert(ctx)
		if d.vm.Timings().LastResetHow == vm.ResetLibvirt {
			return ResetRevert, err
		}
		return ResetLoadvm, err
	}, newSeed())
}

// restore runs load, which restores a snapshot of the VM and returns the
// kind of reset it was, then thaws the guest: it sets the guest clock,
// which the snapshot turned back to when it was taken, and reseeds the
// guest kernel's random generator with seed, which the snapshot turned
// back too.
func (d *Desktop) restore(ctx context.Context, load func(context.Context) (string, error), seed []byte) (string, error) {
	// Connections kept alive across the restore lead to a guest that no
	// longer knows them.
	d.guest.CloseIdleConnections()
	d.probe.forgetOffset()
	how, err := load(ctx)
	d.guest.CloseIdleConnections()
	if err != nil {
		return how, err
	}
	// The probe that found the guest answering read its clock: when that
	// reading was quick enough to trust, one call sets it.
	t0 := time.Now()
	off, rtt, ok := d.probe.offset()
	reread := !ok || rtt > maxClockRTT
	if reread {
		again, rtt2, err := clockOffset(ctx, d.guest)
		if err != nil {
			return how, fmt.Errorf("set the guest clock: %w", err)
		}
		if !ok || rtt2 < rtt {
			off, rtt = again, rtt2
		}
	}
	err = d.sh.thaw(ctx, off, seed)
	d.log.Debug("restore", "how", how, "restore", d.vm.Timings().LastReset, "clock_offset", off, "clock_rtt", rtt,
		"clock_reread", reread, "thaw", time.Since(t0), "helper", d.sh.helper != "" && !d.sh.noHelper)
	return how, err
}

// WaitAfterReset waits until the screen settled and the guest is idle after
// a reset, at most Ready.AfterResetMax. It waits after a golden state too,
// though the state was taken on a settled screen: the clock set forward
// after the load can make programs redraw (a panel's clock, timers), and
// the first observation must not race them.
func (d *Desktop) WaitAfterReset(ctx context.Context) error {
	return d.wait(ctx, "wait after reset", d.cfg.Ready.AfterResetMax)
}

// WaitBeforeEval waits until the screen settled and the guest is idle
// before grading, at most Ready.BeforeEvalMax.
func (d *Desktop) WaitBeforeEval(ctx context.Context) error {
	return d.wait(ctx, "wait before eval", d.cfg.Ready.BeforeEvalMax)
}

func (d *Desktop) wait(ctx context.Context, op string, max time.Duration) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	if _, err := d.readySignal(ctx, max); err != nil {
		return d.fail(op, err)
	}
	return nil
}

// WaitReady waits after an action until the screen settled and the guest
// is idle (see readySignal), at most max, and returns the screen it ended
// on as the observation to continue from.
func (d *Desktop) WaitReady(ctx context.Context, max time.Duration) (desktop.Ready, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.Ready{}, err
	}
	defer done()
	r, err := d.readySignal(ctx, max)
	if err != nil {
		return r, d.fail("wait ready", err)
	}
	return r, nil
}

// Observe takes a screenshot.
func (d *Desktop) Observe(ctx context.Context) (desktop.Observation, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.Observation{}, err
	}
	defer done()
	obs, err := d.screenshot(ctx)
	if err != nil {
		return obs, d.fail("observe", err)
	}
	return obs, nil
}

// screenshot takes one; the observation's At is when it was requested.
func (d *Desktop) screenshot(ctx context.Context) (desktop.Observation, error) {
	at := time.Now()
	shot, err := d.guest.Screenshot(ctx)
	if err != nil {
		return desktop.Observation{}, err
	}
	return desktop.Observation{Screenshot: shot.PNG, Width: shot.Width, Height: shot.Height, At: at}, nil
}

// Act runs one action. WAIT, DONE and FAIL only count as the attempt's last
// action (WAIT does not sleep: the wait for the screen that follows every
// action covers it). Code runs as a pyautogui program; a program that fails
// in the guest, or that the guest refuses to run (its 120 s limit), is an
// ActResult with a non-zero exit code, not an error.
func (d *Desktop) Act(ctx context.Context, action desktop.Action) (desktop.ActResult, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.ActResult{}, err
	}
	defer done()
	d.lastAction = action
	if action.Kind != desktop.Code {
		return desktop.ActResult{}, nil
	}
	res, ran, err := d.actExecutor(ctx, action.Code)
	if !ran && err == nil {
		res, err = d.guest.RunPyautogui(ctx, action.Code)
	}
	var gerr *guest.Error
	if err != nil && errors.As(err, &gerr) && gerr.Status != 0 && ctx.Err() == nil {
		// The guest answered: it is up, the action is what failed.
		return desktop.ActResult{ExitCode: -1, Error: err.Error()}, nil
	}
	if err != nil {
		return desktop.ActResult{}, d.fail("act", err)
	}
	return desktop.ActResult{ExitCode: res.ReturnCode, Output: res.Output, Error: res.Error}, nil
}

// Evaluate grades the attempt with the task's evaluator (its postconfig
// steps first) and the attempt's last action.
func (d *Desktop) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	r, err := d.grader.Evaluate(ctx, task, d.lastAction)
	d.mu.Lock()
	d.lastGrading = r.Metrics
	d.mu.Unlock()
	if err != nil {
		return 0, d.fail("evaluate", err)
	}
	return r.Score, nil
}

// AccessibilityTree returns the screen's accessibility tree as OSWorld's
// guest server gives it (XML).
func (d *Desktop) AccessibilityTree(ctx context.Context) (string, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	tree, err := d.guest.Accessibility(ctx)
	if err != nil {
		return "", d.fail("accessibility tree", err)
	}
	return tree, nil
}

// Close releases the desktop: it stops running calls, the grader's
// process, and, for a VM, destroys it with its overlay. It is idempotent
// and safe to call from any goroutine.
func (d *Desktop) Close() error {
	d.closeOnce.Do(func() {
		// Calls in flight end first, so no reset starts an executor
		// after the one stopped here.
		d.closeNow()
		d.stopExecutor()
		var errs []error
		if err := d.closeFork(); err != nil {
			errs = append(errs, fmt.Errorf("close fork clones and templates: %w", err))
		}
		if d.grader != nil {
			if err := d.grader.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close grader: %w", err))
			}
		}
		d.fwd.close()
		if d.vm != nil {
			if err := d.vm.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		d.guest.CloseIdleConnections()
		if d.setup != nil && d.setup.Browser != nil {
			d.setup.Browser.CloseIdleConnections()
		}
		if d.tmpDir != "" {
			if err := os.RemoveAll(d.tmpDir); err != nil {
				errs = append(errs, err)
			}
		}
		if d.release != nil {
			d.release()
		}
		d.closeErr = errors.Join(errs...)
		if d.closeErr != nil {
			d.log.Error("desktop close", "err", d.closeErr)
		} else {
			d.log.Debug("desktop closed")
		}
	})
	return d.closeErr
}
