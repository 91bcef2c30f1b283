package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	rl "legato/rl"
	"legato/rl/schema"
)

// runReplay is `legato rl replay`.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr}
	fs, f := newDesktopFlags("legato rl replay", stderr)
	var all bool
	var pace, report string
	fs.BoolVar(&all, "all", false, "replay every graded attempt of the run (the default when no rollout id is given)")
	choiceVar(fs, &pace, "pace", "ready", []string{"ready", "recorded"}, "when each step's actions run: ready (as soon as the screen is ready) or recorded (after as long as the step's model call took, as in the batch)")
	fs.StringVar(&report, "report", "", "write the report to `FILE` (default: DIR/replay.json)")
	setUsage(fs, `Usage: legato rl replay DIR [ROLLOUT_ID ...|--all] [--desktops N] [--tasks FILE] [backend flags]

Runs recorded attempts of the run directory DIR again, without a model:
each from its start state (the same golden state where it had one), with
its recorded actions, waiting for the screen after each as collect did;
compares every step's screen with the recorded one (identical bytes, or the
share of pixels that differ) and grades the end. It writes the report to
DIR/replay.json and prints per attempt the first step that diverged and the
recorded and replayed rewards. Give it the batch's --tasks, backend and
harness flags. A task whose replays do not show the recorded first screen is
quarantined (DIR/quarantine.json, and --quarantine FILE). Like export, it
refuses a run with a damaged line of rollouts.jsonl other than the last or
with two final records of an attempt; 'legato rl repair DIR' moves them aside.

`)
	dir, ids, err := parseRunDirIDs(fs, args)
	if err != nil {
		return err
	}
	if all && len(ids) > 0 {
		return usageErrorf("--all replays every attempt: give rollout ids or --all, not both")
	}
	if report == "" {
		report = filepath.Join(dir, rl.ReplayFile)
	} else if err := schema.CheckOutput(dir, report); err != nil {
		return usageErrorf("--report: %v", err)
	}
	log := f.logger(stderr)
	cleanup, tasks, err := f.setup(ctx, log, stderr, true)
	defer cleanup()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replaying %s on %d %s desktops\n", describeReplay(ids), f.opts.Desktops, f.backend)
	rep, err := rl.Replay(ctx, dir, rl.ReplayOptions{NewDesktop: f.opts.NewDesktop, Desktops: f.opts.Desktops, Tasks: tasks,
		Rollouts: ids, Harness: f.opts.Harness, Ready: f.opts.Ready, RecordedPace: pace == "recorded",
		Quarantine: f.opts.Quarantine, Logger: log})
	if rep != nil {
		if _, werr := schema.WriteFileAtomic(report, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}); werr != nil {
			return errors.Join(err, fmt.Errorf("write the replay report: %w", werr))
		}
		writeReplay(stdout, rep, report)
	}
	if errors.Is(err, rl.ErrReplay) {
		return usage(err)
	}
	return err
}

func describeReplay(ids []string) string {
	if len(ids) == 0 {
		return "every graded attempt"
	}
	return fmt.Sprintf("%d attempts", len(ids))
}

// writeReplay prints a line per attempt and the totals.
func writeReplay(w io.Writer, rep *rl.ReplayReport, path string) {
	for _, a := range rep.Attempts {
		diverged := "every screen identical"
		if a.FirstDivergence >= 0 {
			diverged = fmt.Sprintf("first diverged at step %d (%.1f%% of pixels)", a.FirstDivergence, 100*a.Screens[a.FirstDivergence].Distance)
		}
		fmt.Fprintf(w, "%s: reward %s → %s; %d/%d screens identical, %s; %.1f s (recorded %.1f s)",
			a.RolloutID, rewardText(a.RecordedReward), rewardText(a.ReplayedReward), a.ScreensIdentical, len(a.Screens), diverged, a.ReplayS, a.RecordedS)
		if a.Error != "" {
			fmt.Fprintf(w, "; not replayed to its grade: %s", a.Error)
		}
		fmt.Fprintln(w)
	}
	share := func(n, of int) float64 {
		if of == 0 {
			return 0
		}
		return 100 * float64(n) / float64(of)
	}
	fmt.Fprintf(w, "replayed %d of %d attempts: rewards agree on %d (%.0f%%); screens identical %d of %d (%.1f%%); %.1f s per attempt vs %.1f s recorded; report %s\n",
		rep.Replayed, len(rep.Attempts), rep.RewardsAgree, share(rep.RewardsAgree, rep.Replayed), rep.ScreensIdentical, rep.Screens,
		share(rep.ScreensIdentical, rep.Screens), rep.ReplayS/float64(max(len(rep.Attempts), 1)), rep.RecordedS/float64(max(len(rep.Attempts), 1)), path)
	for _, id := range rep.Quarantined {
		fmt.Fprintf(w, "quarantined %s (%s)\n", id, schema.QuarantineReplayDiverges)
	}
}

func rewardText(r *float64) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%g", *r)
}
