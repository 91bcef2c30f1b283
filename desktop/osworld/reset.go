package osworld

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
)

// resetFacts gathers what planReset decides from. Its only call to the
// guest's side is the VM's identity, and only for a task that may have a
// golden state (its key depends on it).
func (d *Desktop) resetFacts(ctx context.Context, task desktop.Task) resetFacts {
	h := &d.history
	f := resetFacts{
		task:        prevAttempt{id: task.ID, domain: task.Domain},
		prev:        h.prev,
		vm:          d.vm != nil,
		fresh:       h.fresh,
		parked:      d.golden.fork.parked || d.golden.fork.unparked,
		noFastReset: d.cfg.NoFastReset,
		revertTask:  d.cfg.revertDomain(task.Domain),
		warned:      h.warned[task.Domain],
		fast:        h.chooser.fast,
		loadvm:      h.chooser.loadvm,
		resets:      h.chooser.resets,
	}
	if h.prev.id != "" {
		f.revertPrev = d.cfg.revertDomain(h.prev.domain)
		f.fellBack = h.chooser.fellBack[h.prev.id]
	}
	if d.vm != nil {
		f.golden = d.goldenFacts(ctx, task)
	}
	return f
}

// goldenFacts is what the desktop knows of task's golden state.
func (d *Desktop) goldenFacts(ctx context.Context, task desktop.Task) goldenFacts {
	if why := goldenRefusal(task, d.cfg.Golden); why != "" {
		return goldenFacts{refused: why, quiet: d.cfg.Golden.Off || len(task.Setup) == 0}
	}
	if why, ok := d.golden.broken[task.ID]; ok {
		return goldenFacts{broken: why}
	}
	t0 := time.Now()
	id, err := d.vm.Identity(ctx)
	d.log.Debug("vm identity", "took", time.Since(t0), "identity", id)
	var key string
	if err == nil {
		key, err = goldenKey(task, d.cfg, id)
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("cannot key the task's golden state; resetting as without", "task", task.ID, "err", err)
		}
		return goldenFacts{keyErr: err.Error()}
	}
	g := goldenFacts{key: key, id: id, template: d.golden.forks.has(templateKey(d.host, key))}
	if s := d.golden.get(task.ID); s != nil {
		g.have = s.key
	}
	return g
}

// fallsBack says whether a step of a reset plan that failed with err hands
// over to the plan's next step. A fast reset does when the guest reported
// what it could not undo; a snapshot load or a fork whenever the failure is
// theirs; nothing does when the call was given up, the desktop closed, or
// the VM did not come back from parking (the next reset tries again).
func fallsBack(kind ResetKind, err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, desktop.ErrClosed), errors.Is(err, vm.ErrClosed), errors.Is(err, errUnpark):
		return false
	}
	switch kind {
	case ResetFast:
		return errors.Is(err, ErrFastReset)
	case ResetLoadvm, ResetGolden, ResetGoldenFork:
		return true
	}
	return false
}

// stepResult is what a reset step that ran reports.
type stepResult struct {
	kind ResetKind // ResetFastIncomplete for a fast reset accepted with leftovers
	// detail adds to the step's reason: which golden state, what is left.
	detail string
	// execDir is the action executor a golden state holds ("" for none).
	execDir string
	clean   cleanResult
}

// runPlan runs the plan's steps until one succeeds, then the task's setup
// and, where planned, takes its golden state. A failed step that falls
// back (fallsBack) is reported and the next one runs; the plan itself is
// never rewritten.
func (d *Desktop) runPlan(ctx context.Context, task desktop.Task, f resetFacts, p resetPlan) (ResetReport, error) {
	h := &d.history
	rep := ResetReport{TaskID: task.ID}
	if p.warn {
		h.warned[task.Domain] = true
		d.log.Warn("this task needs a snapshot revert, which a guest given by URL cannot do: fast-resetting it, so state the fast reset does not restore may carry over between attempts",
			"domain", task.Domain, "task", task.ID, "guest", d.name)
	}
	if p.forget {
		if err := d.endClone(ctx, false); err != nil {
			return rep, d.fail("reset", fmt.Errorf("%w: %w", errUnpark, err))
		}
		d.log.Info("the task's golden state is out of date; taking it again", "task", task.ID, "why", p.note)
		d.forgetGolden(ctx, d.golden.get(task.ID))
	}
	d.log.Debug("reset plan", "task", task.ID, "plan", p.describe(), "note", p.note)
	var (
		tried    []ResetKind
		whys     []string
		res      stepResult
		step     resetStep
		err      error
		fellBack string // what the fast reset could not undo
	)
	if p.note != "" {
		whys = append(whys, p.note)
	}
	t0 := time.Now()
	for _, step = range p.steps {
		// From here on the desktop holds this task's attempt (or a reset
		// that failed on the way to it): the next reset undoes that.
		h.prev, h.fresh = f.task, false
		tried = append(tried, step.kind)
		res, err = d.runStep(ctx, task, f, step)
		if step.kind == ResetFast {
			rep.Ended, rep.Spared, rep.Closed = res.clean.Ended, res.clean.Spared, res.clean.Windows.Closed
			rep.Left = append(res.clean.Broken, res.clean.Problems...)
		}
		if err == nil || len(tried) == len(p.steps) || !fallsBack(step.kind, err) || d.closeCtx.Err() != nil {
			break
		}
		d.log.Warn("reset failed; going on to the plan's next step", "task", task.ID, "failed", step.kind, "after_task", f.prev.id, "err", err)
		whys = append(whys, step.why, failure(step.kind, err, rep.Left))
		if step.kind == ResetFast {
			fellBack = strings.Join(rep.Left, "; ")
			if fellBack == "" {
				fellBack = err.Error()
			}
		}
		d.stepFailed(ctx, task, step.kind, err)
	}
	rep.Kind = reportKind(tried)
	if err != nil {
		return rep, d.fail("reset ("+string(rep.Kind)+")", err)
	}
	rep.Restore = time.Since(t0)
	if res.kind != "" {
		rep.Kind = res.kind
	}
	rep.Why = strings.Join(append(whys, withDetail(step.why, res.detail)), "; ")
	d.golden.fork.unparked = false
	d.history.chooser.learn(f, tried, rep.Restore, fellBack)
	if !step.setup {
		// A golden state: it holds the setup, and the executor that ran
		// when it was taken.
		d.resumeExecutor(ctx, res.execDir)
		return rep, nil
	}
	d.startExecutor(ctx)
	t1 := time.Now()
	if err := d.setup.Run(ctx, task, task.Setup); err != nil {
		return rep, d.fail("setup", err)
	}
	rep.Setup = time.Since(t1)
	if step.build {
		return d.takeGolden(ctx, task, f.golden, rep)
	}
	return rep, nil
}

// failure says what a failed step left to the next, for the report.
func failure(kind ResetKind, err error, left []string) string {
	if kind == ResetFast && len(left) > 0 {
		return "the fast reset could not undo the last attempt, falling back to the snapshot: " + strings.Join(left, "; ")
	}
	return fmt.Sprintf("%s failed: %s", kind, clip(err.Error()))
}

// withDetail adds a step's detail (which golden state, what was left) to
// its reason.
func withDetail(why, detail string) string {
	if detail == "" {
		return why
	}
	return why + ": " + detail
}

// runStep runs one reset of a plan. Every reset but a fork runs on the
// VM: the last attempt's clone goes first, and the VM takes its ports back.
func (d *Desktop) runStep(ctx context.Context, task desktop.Task, f resetFacts, s resetStep) (stepResult, error) {
	d.exec = executor{} // the reset ends the last attempt's
	if s.kind != ResetGoldenFork {
		if err := d.endClone(ctx, false); err != nil {
			return stepResult{}, fmt.Errorf("%w: %w", errUnpark, err)
		}
	}
	switch s.kind {
	case ResetNone:
		return stepResult{}, nil
	case ResetFast:
		return d.fastStep(ctx, task, s)
	case ResetLoadvm:
		return stepResult{}, d.restore(ctx, s.kind, d.vm.RevertLoadvm, newSeed())
	case ResetRevert:
		return stepResult{}, d.restore(ctx, s.kind, d.vm.RevertLibvirt, newSeed())
	case ResetGoldenFork:
		return d.forkStep(ctx, f.golden.key)
	case ResetGolden:
		return d.goldenStep(ctx, task, f.golden.key)
	}
	return stepResult{}, fmt.Errorf("reset plan: unknown step %q", s.kind)
}

// fastStep runs the fast reset; a guest given by URL goes on from what it
// could not undo (acceptLeft), with a warning.
func (d *Desktop) fastStep(ctx context.Context, task desktop.Task, s resetStep) (stepResult, error) {
	cfg, err := d.cfg.cleanConfig()
	if err != nil {
		return stepResult{}, err
	}
	r, err := d.sh.resetClean(ctx, cfg)
	res := stepResult{clean: r}
	for _, p := range r.Ended {
		d.log.Info("fast reset ended a process of the last attempt", "task", task.ID, "pid", p.PID, "name", p.Name, "uid", p.UID)
	}
	d.log.Debug("fast reset in the guest", "seconds", r.Seconds, "restored", r.Restored)
	if err != nil && s.acceptLeft && errors.Is(err, errLeft) {
		left := strings.Join(append(r.Broken, r.Problems...), "; ")
		d.log.Warn("the fast reset could not undo all of the last attempt, and a guest given by URL has no snapshot to fall back to: this attempt starts from what is left",
			"task", task.ID, "left", left)
		res.kind, res.detail = ResetFastIncomplete, "left of the earlier attempt: "+left
		return res, nil
	}
	return res, err
}

// forkStep starts the attempt in a clone of the pool's template of key.
func (d *Desktop) forkStep(ctx context.Context, key string) (stepResult, error) {
	fr, err := d.forkGolden(ctx, key)
	if err != nil {
		if fr.templateFault && ctx.Err() == nil && d.closeCtx.Err() == nil {
			d.golden.forks.drop(fr.ft, "its fork failed: "+clip(err.Error()))
		}
		return stepResult{}, err
	}
	ft := fr.ft // by, built, setup and execDir never change
	return stepResult{
		detail:  fmt.Sprintf("forked a clone of it, taken by %s at %s (fork %d; its setup took %s)", ft.by, ft.built.Format(time.TimeOnly), fr.n, secs(ft.setup)),
		execDir: ft.execDir,
	}, nil
}

// goldenStep loads the desktop's golden state of the task in place, after
// checking that its snapshot still carries key.
func (d *Desktop) goldenStep(ctx context.Context, task desktop.Task, key string) (stepResult, error) {
	g := d.golden.get(task.ID)
	if g == nil {
		return stepResult{}, errors.New("the desktop's golden state of the task went")
	}
	t0 := time.Now()
	desc, err := d.vm.SnapshotDescription(ctx, g.name)
	if err != nil {
		return stepResult{}, err
	}
	d.log.Debug("golden snapshot description", "took", time.Since(t0))
	if got := goldenKeyOf(desc); got != key {
		return stepResult{}, fmt.Errorf("%w: snapshot %s carries key %q, want %s…", errGoldenStale, g.name, clip(got), short(key))
	}
	if err := d.loadGolden(ctx, g); err != nil {
		return stepResult{}, err
	}
	d.golden.touch(g)
	return stepResult{
		detail:  fmt.Sprintf("loaded it, taken on this desktop at %s (load %d; its setup took %s)", g.built.Format(time.TimeOnly), g.loads, secs(g.setup)),
		execDir: g.execDir,
	}, nil
}

// stepFailed keeps what a failed step teaches: a golden state that did not
// load goes (and, unless it was only out of date, the task resets without
// one on this desktop from then on).
func (d *Desktop) stepFailed(ctx context.Context, task desktop.Task, kind ResetKind, err error) {
	if kind != ResetGolden {
		return
	}
	g := d.golden.get(task.ID)
	if g == nil {
		return
	}
	d.forgetGolden(ctx, g)
	if !errors.Is(err, errGoldenStale) {
		d.golden.markBroken(task.ID, "its golden state did not load: "+err.Error())
	}
}

// learn records the cost of a reset to the clean state that ran on the VM,
// and a fast reset that fell back to the snapshot after its task.
func (c *resetChooser) learn(f resetFacts, tried []ResetKind, took time.Duration, fellBack string) {
	first := tried[0]
	if !f.vm || first == ResetNone || first == ResetGolden || first == ResetGoldenFork {
		return
	}
	c.resets++
	if first == ResetLoadvm {
		// A loadvm that failed over to libvirt's revert: choosing loadvm
		// cost that.
		c.loadvm.add(took, c.resets)
		return
	}
	// Choosing the fast reset cost whatever followed it.
	c.fast.add(took, c.resets)
	if len(tried) > 1 && f.prev.id != "" {
		if c.fellBack == nil {
			c.fellBack = map[string]string{}
		}
		c.fellBack[f.prev.id] = fellBack
	}
}

// takeGolden takes the task's golden state after its setup ran on a clean
// state; a state that cannot be taken leaves the task without golden
// states on this desktop.
func (d *Desktop) takeGolden(ctx context.Context, task desktop.Task, g goldenFacts, rep ResetReport) (ResetReport, error) {
	t0 := time.Now()
	_, err := d.buildGolden(ctx, task, g.key, g.id, rep.Setup)
	switch {
	case err == nil:
		rep.Why = fmt.Sprintf("%s (reset: %s)", rep.Why, rep.Kind)
		rep.Kind = ResetGoldenBuild
		rep.Golden = time.Since(t0)
	case ctx.Err() != nil:
		return rep, d.fail("reset ("+string(ResetGoldenBuild)+")", err)
	default:
		// The attempt goes on from the state the setup left; the task
		// resets as without golden states on this desktop.
		d.log.Warn("could not take the task's golden state; its attempts reset and run its setup instead", "task", task.ID, "err", err)
		d.golden.markBroken(task.ID, "taking its golden state failed: "+err.Error())
		rep.Why = fmt.Sprintf("%s; taking the golden state failed: %s", rep.Why, clip(err.Error()))
	}
	return rep, nil
}

// errUnpark means the desktop's VM could not take its ports back from its
// clones: the reset fails (the next one tries again), and the golden
// state, which did nothing wrong, stays.
var errUnpark = errors.New("the VM did not come back from parking")

// errGoldenStale means a golden state's snapshot carries another key than
// the task and VM give now: it is deleted and taken again, never loaded.
var errGoldenStale = errors.New("golden state out of date")
