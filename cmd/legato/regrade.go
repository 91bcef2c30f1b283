package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	rl "legato/rl"
	"legato/rl/schema"
)

// runRegrade is `legato rl regrade`.
func runRegrade(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr}
	fs, f := newDesktopFlags("legato rl regrade", stderr)
	setUsage(fs, `Usage: legato rl regrade DIR [ROLLOUT_ID ...] [--tasks FILE] [backend flags]

Grades the end states that collect --keep-end-states kept in the run
directory DIR again, without running the agent: each state is brought back
and graded with its task's evaluator and config as the tasks file has them
now (and today's grading code). The new rewards are appended to
DIR/regrades.jsonl beside the recorded ones, which never change; it prints
the attempts whose reward changed. 'legato rl export DIR --rewards regraded'
then trains on the new rewards. Like export, it refuses a run with a damaged
line of rollouts.jsonl other than the last or with two final records of an
attempt; 'legato rl repair DIR' moves them aside. A kept state is read only
as a regular file reached without a symlink, through directories of root's
or yours that nobody else may write in (others only with the sticky bit, as
/tmp).

`)
	dir, ids, err := parseRunDirIDs(fs, args)
	if err != nil {
		return err
	}
	f.endStatesIn = dir
	log := f.logger(stderr)
	cleanup, tasks, err := f.setup(ctx, log, stderr, true)
	defer cleanup()
	if err != nil {
		return err
	}
	rep, err := rl.Regrade(ctx, dir, rl.RegradeOptions{NewDesktop: f.opts.NewDesktop, Desktops: f.opts.Desktops, Tasks: tasks, Rollouts: ids, Logger: log})
	if rep != nil {
		for _, r := range rep.Regrades {
			switch {
			case r.Regraded == nil:
				fmt.Fprintf(stdout, "%s (%s): not regraded: %s\n", r.RolloutID, r.TaskID, r.Error)
			case *r.Regraded != *r.Reward:
				fmt.Fprintf(stdout, "%s (%s): reward %g → %g\n", r.RolloutID, r.TaskID, *r.Reward, *r.Regraded)
			}
		}
		fmt.Fprintf(stdout, "regraded %d kept end states: %d rewards changed, %d not regraded; appended to %s\n",
			len(rep.Regrades), rep.Changed, rep.Failed, filepath.Join(dir, schema.RegradeFile))
	}
	if errors.Is(err, rl.ErrRegrade) {
		return usage(err)
	}
	return err
}
