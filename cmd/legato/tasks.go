package main

import (
	"context"
	"fmt"
	"io"

	rl "legato/rl"
)

// runTasks is `legato rl tasks`: for now its one subcommand, check.
func runTasks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelpFlag(args[0]) {
		return runTasksCheck(ctx, args, stdout, stderr)
	}
	if len(args) == 0 || args[0] != "check" {
		return usageErrorf("legato rl tasks: want the subcommand check (legato rl tasks check --tasks FILE [backend flags])")
	}
	return runTasksCheck(ctx, args[1:], stdout, stderr)
}

// runTasksCheck is `legato rl tasks check`.
func runTasksCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr}
	fs, f := newDesktopFlags("legato rl tasks check", stderr)
	setUsage(fs, `Usage: legato rl tasks check [--tasks FILE] [--desktops N] [--quarantine FILE] [backend flags]

Tries every task twice before a batch, each time on a fresh state: the
reset and the task's setup, the first screen, the untouched start state
graded twice. It prints, per task, whether it is fit to train on, and for
the unfit what it would quarantine and why: a setup that fails, a grader
that fails, returns a reward out of [0, 1] or two rewards for one state,
two resets showing different first screens, an untouched start state that
already scores above 0 (solved_at_start: a policy would be rewarded for
doing nothing; the evidence says what the result getter returned). With
--quarantine FILE the unfit tasks go into that file (collect --quarantine
FILE then skips them).
It exits 1 when a task is unfit.

`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	log := f.logger(stderr)
	cleanup, tasks, err := f.setup(ctx, log, stderr, true)
	defer cleanup()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "trying %d tasks twice each on %d %s desktops\n", len(tasks), f.opts.Desktops, f.backend)
	probes, err := rl.ProbeTasks(ctx, tasks, rl.ProbeTasksOptions{NewDesktop: f.opts.NewDesktop, Desktops: f.opts.Desktops,
		Quarantine: f.opts.Quarantine, Logger: log})
	unfit := 0
	for _, p := range probes {
		if p.TaskID == "" {
			continue // not tried: the check stopped
		}
		if p.Reason == "" {
			fmt.Fprintf(stdout, "%s: fit (reward %s on its start state, reset %.1f s)\n", p.TaskID, rewardText(p.Runs[0].Reward), p.Runs[0].ResetS)
			continue
		}
		unfit++
		fmt.Fprintf(stdout, "%s: unfit, would quarantine: %s: %s\n", p.TaskID, p.Reason, p.Evidence)
	}
	if err != nil {
		return err
	}
	where := "nothing written (--quarantine FILE puts them in)"
	if f.opts.Quarantine != "" {
		where = "put into " + f.opts.Quarantine
	}
	fmt.Fprintf(stdout, "%d of %d tasks fit, %d unfit: %s\n", len(tasks)-unfit, len(tasks), unfit, where)
	if unfit > 0 {
		return fmt.Errorf("%d tasks are unfit to train on", unfit)
	}
	return nil
}
