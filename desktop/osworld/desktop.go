package osworld

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	_ desktop.Regrader    = (*Desktop)(nil)
)

// ResetReport says what the last Reset did, why, and how long its parts
// took.
type ResetReport struct {
	TaskID string
	// Kind is the reset that ran (see ResetKind).
	Kind ResetKind
	// Why says why that reset: the rule or the measured costs that
	// planned it, and for each step that failed on the way what it could
	// not do (for a fast reset, what it could not undo).
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
	// GoldenKey is the key of the golden state the attempt starts from
	// (loaded, forked or just taken), "" when it starts otherwise.
	GoldenKey string
	// Ended names the processes a fast reset ended, Spared those started
	// since the clean state it left running as not the desktop user's or
	// not of the desktop's session;
	// Closed the windows it closed; Left says what it could not undo.
	Ended, Spared []desktop.Process
	Closed, Left  []string
}

// Desktop is one OSWorld guest, driven through its guest server: a VM this
// process started (see VMDesktop) or a guest that runs elsewhere. It
// implements desktop.Desktop, desktop.ReadyWaiter and desktop.Regrader, and on a
// VM with Config.EndStates desktop.EndStateKeeper and desktop.EndStateGrader.
// Its methods follow the contract of package desktop: no two run at once,
// except Close.
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
	// release tells the pool the desktop is gone; leaving asks it whether
	// the desktop's host is leaving (nil: it never does).
	release func()
	leaving func() bool

	closeCtx  context.Context
	closeNow  context.CancelFunc
	closeOnce sync.Once
	closeErr  error

	// Attempt state, used only by the (sequential) methods.
	lastAction desktop.Action
	noLoad     bool     // the guest's load cannot be measured
	noDamage   bool     // the guest cannot watch its screen
	exec       executor // the attempt's action executor (executor.go)
	waits      waitCosts
	history    resetHistory // what the next reset plan needs to know
	golden     goldenPath
	// pending is the screen the wait after the reset ended on, which the
	// first Observe returns; any other call drops it.
	pending *desktop.Observation
	// shots says whether the executor's screenshots are trusted (one
	// check per desktop: they depend on the guest server);
	// testShotLevel sets their zlib level in tests.
	shots         shotTrust
	shotDiffs     int // settled screens the two differed on
	testShotLevel *int
	testPointer   string // the executor's pointer style, in tests
	// probe is the VM's readiness probe, which measures the guest clock's
	// offset when the guest answers after a revert; nil for a guest given
	// by URL.
	probe *vmPrep

	mu          sync.Mutex // guards lastReset, lastGrading, unsettledStart and execDir
	lastReset   ResetReport
	lastGrading []desktop.MetricRun // how the last Evaluate's metrics ran
	execDir     string              // the last executor's directory, for Close
	// unsettledStart says the wait after the last reset reached its
	// bound before the screen settled.
	unsettledStart bool
}

// VMDesktop is a Desktop on a VM this process started. It adds VM.
type VMDesktop struct {
	*Desktop
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

// Reset brings the desktop to the task's initial state: planReset decides
// which resets to try and in what order (a golden state on a VM, loaded or
// forked, else taken after this reset's setup; a fast reset or the clean
// snapshot, whichever the rules and the measured costs say; a guest given
// by URL can only fast-reset), runPlan runs them until one succeeds, then
// the task's setup. LastReset says which reset ran and why.
func (d *Desktop) Reset(ctx context.Context, task desktop.Task) error {
	return d.reset(ctx, task, planReset)
}

// reset is Reset with the plan made by plan from the desktop's facts: the
// benchmark plans each reset kind in turn.
func (d *Desktop) reset(ctx context.Context, task desktop.Task, plan func(resetFacts) resetPlan) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.lastAction = desktop.Action{}
	d.pending = nil
	d.mu.Lock()
	d.lastGrading = nil
	d.unsettledStart = false
	d.mu.Unlock()
	if err := d.checkTask(task); err != nil {
		return d.fail("reset", err)
	}
	facts := d.resetFacts(ctx, task)
	rep, err := d.runPlan(ctx, task, facts, plan(facts))
	if err != nil {
		return err
	}
	rep.GoldenKey = startKey(rep.Kind, facts.golden.key)
	d.setLastReset(rep)
	d.log.Debug("reset", "task", task.ID, "kind", rep.Kind, "why", rep.Why, "restore", rep.Restore, "setup", rep.Setup,
		"golden", rep.Golden, "ended", rep.Ended, "closed", rep.Closed)
	return nil
}

func (d *Desktop) setLastReset(rep ResetReport) {
	d.mu.Lock()
	d.lastReset = rep
	d.mu.Unlock()
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

// restore runs load, which restores a snapshot of the VM (how names it in
// the log), then thaws the guest: it sets the guest clock,
// which the snapshot turned back to when it was taken, and reseeds the
// guest kernel's random generator with seed, which the snapshot turned
// back too.
func (d *Desktop) restore(ctx context.Context, how ResetKind, load func(context.Context) error, seed []byte) error {
	// Connections kept alive across the restore lead to a guest that no
	// longer knows them.
	d.guest.CloseIdleConnections()
	d.probe.forgetOffset()
	err := load(ctx)
	d.guest.CloseIdleConnections()
	if err != nil {
		return err
	}
	// The probe that found the guest answering read its clock: when that
	// reading was quick enough to trust, one call sets it.
	t0 := time.Now()
	off, rtt, ok := d.probe.offset()
	reread := !ok || rtt > maxClockRTT
	if reread {
		again, rtt2, err := clockOffset(ctx, d.guest)
		if err != nil {
			return fmt.Errorf("set the guest clock: %w", err)
		}
		if !ok || rtt2 < rtt {
			off, rtt = again, rtt2
		}
	}
	err = d.sh.thaw(ctx, off, seed)
	d.log.Debug("restore", "how", how, "restore", d.vm.Timings().LastReset, "clock_offset", off, "clock_rtt", rtt,
		"clock_reread", reread, "thaw", time.Since(t0), "helper", d.sh.helper != "" && !d.sh.noHelper)
	return err
}

// WaitAfterReset waits until the screen settled and the guest is idle after
// a reset, at most Ready.AfterResetMax. It waits after a golden state too,
// though the state was taken on a settled screen: the clock set forward
// after the load can make programs redraw (a panel's clock, timers), and
// the first observation must not race them.
func (d *Desktop) WaitAfterReset(ctx context.Context) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.pending = nil
	r, err := d.readySignal(ctx, d.cfg.Ready.AfterResetMax, waitFor{shot: true})
	if err != nil {
		return d.fail("wait after reset", err)
	}
	// The attempt goes on from the screen as it is; the record says so
	// (AttemptReport), as a post-action wait's does.
	d.mu.Lock()
	d.unsettledStart = !r.Settled
	task := d.lastReset.TaskID
	d.mu.Unlock()
	if !r.Settled {
		d.log.Warn("the screen did not settle after the reset: the attempt starts from a screen still changing (a program that keeps animating, or one still starting)",
			"task", task, "bound", d.cfg.Ready.AfterResetMax)
	}
	// The first observation: the screen the wait ended on, with no second
	// screenshot of it.
	d.pending = &r.Observation
	return nil
}

// WaitBeforeEval waits until the screen settled and the guest is idle
// before grading, at most Ready.BeforeEvalMax.
func (d *Desktop) WaitBeforeEval(ctx context.Context) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.pending = nil
	// After the agent ended the attempt, the executor knows the screen
	// settled after the last action: it counts the quiet from then on,
	// and one look tells whether it lasted. Grading needs no screenshot.
	_, err = d.readySignal(ctx, d.cfg.Ready.BeforeEvalMax, waitFor{window: "settled"})
	if err != nil {
		return d.fail("wait before eval", err)
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
	d.pending = nil
	r, err := d.readySignal(ctx, max, waitFor{shot: true})
	if err != nil {
		return r, d.fail("wait ready", err)
	}
	return r, nil
}

// Observe takes a screenshot; right after WaitAfterReset, it returns the
// screen that wait ended on.
func (d *Desktop) Observe(ctx context.Context) (desktop.Observation, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.Observation{}, err
	}
	defer done()
	if p := d.pending; p != nil && p.Screenshot != nil {
		d.pending = nil
		return *p, nil
	}
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
	d.pending = nil
	d.lastAction = action
	if action.Kind != desktop.Code {
		return desktop.ActResult{}, nil
	}
	return d.act(ctx, action)
}

// act runs a Code action through the executor, else through `python -c`.
func (d *Desktop) act(ctx context.Context, action desktop.Action) (desktop.ActResult, error) {
	res, _, _, ran, err := d.actExecutor(ctx, action.Code, nil)
	if !ran && err == nil {
		res, err = d.guest.RunPyautogui(ctx, action.Code)
	}
	act, err := d.actResult(ctx, res, err)
	return act, d.fail("act", err)
}

// Evaluate grades the attempt with the task's evaluator (its postconfig
// steps first) and the attempt's last action.
func (d *Desktop) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	d.pending = nil
	r, err := d.grader.Evaluate(ctx, task, d.lastAction)
	d.mu.Lock()
	d.lastGrading = r.Metrics
	d.mu.Unlock()
	if err != nil {
		return 0, d.fail("evaluate", err)
	}
	return r.Score, nil
}

// EvaluateAgain grades the state the last Evaluate graded once more: the
// evaluator's getters and metrics, not its postconfig (desktop.Regrader).
// The first grade's report of how each metric ran stays.
func (d *Desktop) EvaluateAgain(ctx context.Context, task desktop.Task) (float64, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	d.pending = nil
	r, err := d.grader.EvaluateAgain(ctx, task, d.lastAction)
	if err != nil {
		return 0, d.fail("evaluate again", err)
	}
	return r.Score, nil
}

// Retiring reports whether the desktop's host left the DNS name the
// pool's hosts come from (Config.HostsFrom): its worker then replaces it
// after its attempt, and the new desktop goes to a host that stays. It
// implements desktop.Retirer.
func (d *Desktop) Retiring() bool { return d.leaving != nil && d.leaving() }

var _ desktop.Retirer = (*Desktop)(nil)
var _ desktop.Placer = (*Desktop)(nil)

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
