package rl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// RegradeOptions says how Regrade runs.
type RegradeOptions struct {
	// NewDesktop creates the desktops that grade the kept end states:
	// the batch's backend, which must be a desktop.EndStateGrader.
	// Required.
	NewDesktop desktop.Factory
	// Desktops is how many states are graded at once (default 1).
	Desktops int
	// Tasks are the tasks as they are now: each kept state is graded
	// with its task's evaluator and config from here, whatever the
	// attempt ran with (the record's task_sha256 says that).
	Tasks []Task
	// Rollouts names the attempts to grade again; empty means every one
	// with a kept end state.
	Rollouts []string
	Logger   *slog.Logger
}

// RegradeReport is what a regrade did; its lines are appended to the run's
// regrades.jsonl.
type RegradeReport struct {
	Regrades []schema.Regrade
	// Changed counts the regrades whose reward differs from the
	// recorded one; Failed those that gave none.
	Changed, Failed int
}

// ErrRegrade is wrapped by Regrade's errors about its input.
var ErrRegrade = errors.New("regrade")

// Regrade grades the kept end states of the run directory runDir again, on
// desktops that bring each back, with the tasks' evaluators and configs as
// they are now, and appends the new rewards to runDir's regrades.jsonl,
// beside the recorded ones (rollouts.jsonl is never changed). Export takes
// them with Options.Rewards "regraded".
func Regrade(ctx context.Context, runDir string, opts RegradeOptions) (*RegradeReport, error) {
	if opts.NewDesktop == nil {
		return nil, fmt.Errorf("%w: no desktops: set RegradeOptions.NewDesktop", ErrRegrade)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	recs, err := regradeRecords(runDir, opts)
	if err != nil {
		return nil, err
	}
	tasks := taskIndex(opts.Tasks)
	rep := &RegradeReport{Regrades: make([]schema.Regrade, len(recs))}
	onDesktops(ctx, len(recs), opts.Desktops, opts.NewDesktop, opts.Logger, func(w *worker, i int) {
		rep.Regrades[i] = regradeOne(ctx, w, &recs[i], tasks[recs[i].TaskID])
	})
	done := rep.Regrades[:0]
	for _, r := range rep.Regrades {
		if r.RolloutID == "" {
			continue // not reached: ctx ended first
		}
		switch {
		case r.Regraded == nil:
			rep.Failed++
		case *r.Regraded != *r.Reward:
			rep.Changed++
		}
		done = append(done, r)
	}
	rep.Regrades = done
	if err := schema.AppendRegrades(runDir, rep.Regrades); err != nil {
		return rep, err
	}
	return rep, ctx.Err()
}

// regradeRecords returns the graded records with a kept end state, in
// file order, refusing a named rollout that is not one and a task not
// given.
func regradeRecords(runDir string, opts RegradeOptions) ([]schema.Record, error) {
	tasks := taskIndex(opts.Tasks)
	recs, err := pickRecords(runDir, opts.Rollouts, ErrRegrade, opts.Logger, func(rec *schema.Record) (string, error) {
		if rec.EndState == nil || rec.EndState.Ref == "" || !rec.Status.Graded() || rec.Reward == nil {
			return "has no kept end state (collect it with --keep-end-states)", nil
		}
		if _, ok := tasks[rec.TaskID]; !ok {
			return "", fmt.Errorf("%w: rollout %s is of task %q, which the tasks given do not have: pass the tasks file (--tasks)", ErrRegrade, rec.RolloutID, rec.TaskID)
		}
		return "", nil
	})
	if err == nil && len(recs) == 0 {
		err = fmt.Errorf("%w: %s kept no end state: collect with --keep-end-states to regrade later", ErrRegrade, runDir)
	}
	return recs, err
}

// regradeOne grades rec's kept end state on w's desktop with task.
func regradeOne(ctx context.Context, w *worker, rec *schema.Record, task Task) (out schema.Regrade) {
	out = schema.Regrade{RolloutID: rec.RolloutID, TaskID: rec.TaskID, Reward: rec.Reward, TaskSHA: TaskSHA(task),
		RecordedTaskSHA: rec.TaskSHA, EndState: rec.EndState.Ref}
	// A named result: the deferred write must reach the caller.
	defer func() { out.At = schema.Time{Time: time.Now()} }()
	d, err := w.desktop(ctx)
	if d == nil {
		out.Error = fmt.Sprintf("no desktop: %v", err)
		return out
	}
	g, ok := d.(desktop.EndStateGrader)
	if !ok {
		out.Error = "the desktop cannot grade kept end states (it is not a desktop.EndStateGrader): regrade with the batch's backend"
		return out
	}
	ctx = desktop.WithAttempt(ctx, desktop.Attempt{GroupID: rec.GroupID, TaskID: rec.TaskID, Index: rec.Attempt, Try: rec.Try})
	r, err := g.GradeEndState(ctx, rec.EndState.Ref, task, lastAction(rec))
	switch {
	case errors.Is(err, desktop.ErrNoEndState):
		out.Error = fmt.Sprintf("the end state is gone (dropped to keep the batch's bound on space, or removed): %v", err)
	case err != nil:
		out.Error = err.Error()
		if desktop.IsFailure(ctx, err) {
			w.discard()
		}
	case !(r >= 0 && r <= 1):
		out.Error = fmt.Sprintf("%v: the desktop returned %v", errBadReward, r)
	default:
		out.Regraded = &r
	}
	return out
}

// lastAction is the attempt's last action, the zero Action when it took
// none.
func lastAction(rec *schema.Record) desktop.Action {
	for i := len(rec.Steps) - 1; i >= 0; i-- {
		if as := rec.Steps[i].Actions; len(as) > 0 {
			return desktop.ParseAction(as[len(as)-1].Action)
		}
	}
	return desktop.Action{}
}
