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
)

// Reset kinds, as ResetReport.Kind names them.
const (
	// ResetNone: the desktop had just been made from its clean snapshot,
	// so there was nothing to undo.
	ResetNone = "none"
	// ResetFast killed the task programs and restored /home/user.
	ResetFast = "fast"
	// ResetRevert restored the VM's clean snapshot.
	ResetRevert = "revert"
	// ResetFastThenRevert: the fast reset failed in the guest and the
	// snapshot was reverted instead.
	ResetFastThenRevert = "fast+revert"
)

// ResetReport says what the last Reset did and how long its parts took.
type ResetReport struct {
	TaskID string
	// Kind is ResetNone, ResetFast, ResetRevert or ResetFastThenRevert.
	Kind string
	// Restore is the time to the clean state (kill + restore, or revert
	// until the guest answered and its clock was set).
	Restore time.Duration
	// Setup is the time the task's setup steps took.
	Setup time.Duration
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

	mu          sync.Mutex // guards lastReset and lastGrading
	lastReset   ResetReport
	lastGrading []desktop.MetricRun // how the last Evaluate's metrics ran
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
	if err := d.revert(ctx); err != nil {
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

// Reset brings the desktop to the task's initial state: a snapshot revert
// for the domains that need one (and for all with NoFastReset) on VMs,
// otherwise a fast reset; then the task's setup steps.
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
	kind := d.resetKind(task)
	d.fresh = false
	t0 := time.Now()
	switch kind {
	case ResetRevert:
		err = d.revert(ctx)
	case ResetFast:
		err = d.fastReset(ctx)
		if err != nil && errors.Is(err, ErrFastReset) && d.vm != nil {
			d.log.Warn("fast reset failed; reverting the snapshot instead", "task", task.ID, "err", err)
			kind = ResetFastThenRevert
			err = d.revert(ctx)
		}
	}
	if err != nil {
		return d.fail("reset ("+kind+")", err)
	}
	t1 := time.Now()
	if err := d.setup.Run(ctx, task, task.Setup); err != nil {
		return d.fail("setup", err)
	}
	rep := ResetReport{TaskID: task.ID, Kind: kind, Restore: t1.Sub(t0), Setup: time.Since(t1)}
	d.mu.Lock()
	d.lastReset = rep
	d.mu.Unlock()
	d.log.Debug("reset", "task", task.ID, "kind", kind, "restore", rep.Restore, "setup", rep.Setup)
	return nil
}

// resetKind chooses how to reset for task.
func (d *Desktop) resetKind(task desktop.Task) string {
	revert := d.cfg.NoFastReset || d.cfg.revertDomain(task.Domain)
	if d.vm == nil {
		if revert && !d.warned[task.Domain] {
			d.warned[task.Domain] = true
			d.log.Warn("this task needs a snapshot revert, which a guest given by URL cannot do: fast-resetting it, so state outside the home directory may carry over between attempts",
				"domain", task.Domain, "task", task.ID, "guest", d.name)
		}
		return ResetFast
	}
	if d.fresh {
		return ResetNone
	}
	if revert {
		return ResetRevert
	}
	return ResetFast
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

// fastReset kills the task programs and restores the home directory.
func (d *Desktop) fastReset(ctx context.Context) error {
	return d.sh.fastReset(ctx, d.cfg.Home, d.cfg.BaselineDir, d.cfg.killList())
}

// revert restores the VM's snapshot and sets the guest clock, which the
// snapshot turned back to when it was taken.
func (d *Desktop) revert(ctx context.Context) error {
	if d.vm == nil {
		return fmt.Errorf("revert: a guest given by URL has no snapshot: %w", desktop.ErrUnsupported)
	}
	// Connections kept alive across the restore lead to a guest that no
	// longer knows them.
	d.guest.CloseIdleConnections()
	err := d.vm.Revert(ctx)
	d.guest.CloseIdleConnections()
	if err != nil {
		return err
	}
	return d.sh.setClock(ctx)
}

// WaitAfterReset waits until the screen settled and the guest is idle after
// a reset, at most Ready.AfterResetMax.
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

// WaitReady waits after an action until Ready.Stable screenshots in a row
// are identical and the guest was idle between them, at most max, and
// returns the last of them as the observation to continue from.
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
	res, err := d.guest.RunPyautogui(ctx, action.Code)
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
		d.closeNow()
		var errs []error
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
