package rl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"image/draw"
	"image/png"
	"log/slog"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// ProbeTasksOptions says how ProbeTasks runs.
type ProbeTasksOptions struct {
	// NewDesktop creates the desktops the tasks are tried on. Required.
	NewDesktop desktop.Factory
	// Desktops is how many tasks are tried at once (default 1).
	Desktops int
	// Quarantine, if set, is a task quarantine file the unfit tasks are
	// put into; without it ProbeTasks only says which they would be.
	Quarantine string
	Logger     *slog.Logger
}

// TaskProbe is what trying a task on fresh states found.
type TaskProbe struct {
	TaskID string `json:"task_id"`
	// Runs are the two tries, each from a fresh reset.
	Runs [2]TaskProbeRun `json:"runs"`
	// Reason is why the task is unfit to train on (a quarantine reason),
	// "" when it is fit; Evidence says what showed it.
	Reason   string `json:"reason,omitempty"`
	Evidence string `json:"evidence,omitempty"`
}

// TaskProbeRun is one try of a task: its reset and setup, its first
// screen, and its start state graded twice.
type TaskProbeRun struct {
	ResetS float64 `json:"reset_s"`
	// Screen is the SHA-256 of the first screenshot's pixels after the
	// reset (screenHash).
	Screen string   `json:"screen,omitempty"`
	Reward *float64 `json:"reward"`
	Again  *float64 `json:"again"`
	// Explain is what the desktop said its first grade rested on
	// (desktop.GradeExplainer), "" when it says nothing.
	Explain string `json:"explain,omitempty"`
	Error   string `json:"error,omitempty"`
	// ResetFailed says Error came from the reset.
	ResetFailed bool `json:"reset_failed,omitempty"`
	// UnsettledStart says the wait after the reset reached its bound
	// before the screen settled (desktop.AttemptReport): Screen is of a
	// screen still changing.
	UnsettledStart bool `json:"unsettled_start,omitempty"`
}

// ProbeTasks tries every task twice before a batch, each time on a fresh
// state: the reset and the task's setup, the first screen, the start state
// graded twice without an action. A task is unfit when its setup fails,
// its grader fails, gives a reward out of [0, 1] or two different rewards
// for the same state, its two resets show different first screens, or its
// untouched start state already scores above 0 (a policy would be rewarded
// for doing nothing; the evidence says what the grader read, where the
// desktop can tell).
// With opts.Quarantine the unfit tasks go into that file. The error is
// about running at all (no desktop, ctx done), not about the tasks.
func ProbeTasks(ctx context.Context, tasks []Task, opts ProbeTasksOptions) ([]TaskProbe, error) {
	if opts.NewDesktop == nil {
		return nil, errors.New("probe tasks: no desktops: set ProbeTasksOptions.NewDesktop")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	out := make([]TaskProbe, len(tasks))
	var mu sync.Mutex
	var noDesktop error
	onDesktops(ctx, len(tasks), opts.Desktops, opts.NewDesktop, opts.Logger, func(w *worker, i int) {
		p := TaskProbe{TaskID: tasks[i].ID}
		for r := range p.Runs {
			d, err := w.desktop(ctx)
			if d == nil {
				mu.Lock()
				noDesktop = errors.Join(noDesktop, err)
				mu.Unlock()
				p.Runs[r].Error = fmt.Sprintf("no desktop: %v", err)
				continue
			}
			if failed := probeRun(ctx, d, tasks[i], &p.Runs[r]); failed {
				w.discard()
			}
		}
		p.Reason, p.Evidence = judgeProbe(p.Runs)
		out[i] = p
	})
	if err := ctx.Err(); err != nil {
		return out, err
	}
	if noDesktop != nil {
		return out, fmt.Errorf("probe tasks: %w", noDesktop)
	}
	if opts.Quarantine != "" {
		add := map[string]schema.QuarantinedTask{}
		for i, p := range out {
			if p.Reason != "" {
				add[p.TaskID] = schema.QuarantinedTask{TaskSHA: TaskSHA(tasks[i]), Reason: p.Reason, Evidence: p.Evidence,
					Since: schema.Time{Time: time.Now()}}
			}
		}
		if _, err := schema.AddQuarantined(opts.Quarantine, add); err != nil {
			return out, err
		}
	}
	return out, nil
}

// probeRun tries task once on d; it reports whether the desktop failed.
func probeRun(ctx context.Context, d desktop.Desktop, task Task, run *TaskProbeRun) (failed bool) {
	// Both tries are the same attempt, one that takes no action: a
	// backend that keys its draws on the attempt (the fake) grades them
	// alike, as a real grader grades one state alike.
	ctx = desktop.WithAttempt(ctx, desktop.Attempt{GroupID: "probe/" + task.ID, TaskID: task.ID})
	fail := func(op string, err error) bool {
		run.Error = fmt.Sprintf("%s: %v", op, err)
		return desktop.IsFailure(ctx, err)
	}
	start := time.Now()
	err := d.Reset(ctx, task)
	run.ResetS = time.Since(start).Seconds()
	if err != nil {
		run.ResetFailed = true
		return fail("reset", err)
	}
	if err := d.WaitAfterReset(ctx); err != nil {
		return fail("wait after reset", err)
	}
	if r, ok := d.(desktop.Reporter); ok {
		run.UnsettledStart = r.AttemptReport().UnsettledStart
	}
	obs, err := d.Observe(ctx)
	if err != nil {
		return fail("observe", err)
	}
	run.Screen = screenHash(obs.Screenshot)
	if err := d.WaitBeforeEval(ctx); err != nil {
		return fail("wait before eval", err)
	}
	r, err := d.Evaluate(ctx, task)
	if err != nil {
		return fail("evaluate", err)
	}
	run.Reward = &r
	if e, ok := d.(desktop.GradeExplainer); ok {
		run.Explain = e.ExplainGrade()
	}
	rg, ok := d.(desktop.Regrader)
	if !ok {
		return false
	}
	again, err := rg.EvaluateAgain(ctx, task)
	if err != nil {
		return fail("evaluate again", err)
	}
	run.Again = &again
	return false
}

// screenHash is the SHA-256 of a PNG screenshot's size and its pixels as
// 8-bit non-premultiplied RGBA, not of its bytes: one screen comes as
// different PNGs from different sources (osworld's executor writes RGB, its
// guest server's /screenshot RGBA: a try that settled and one that did not),
// and two tries must differ only where their pixels do. Bytes that are no
// PNG are hashed as they are, prefixed "bytes:".
func screenHash(shot []byte) string {
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		sum := sha256.Sum256(shot)
		return "bytes:" + hex.EncodeToString(sum[:])
	}
	b := img.Bounds()
	pix, ok := img.(*image.NRGBA)
	if !ok {
		pix = image.NewNRGBA(b)
		draw.Draw(pix, b, img, b.Min, draw.Src)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%dx%d\n", b.Dx(), b.Dy())
	for y := 0; y < b.Dy(); y++ {
		row := pix.Pix[y*pix.Stride:]
		h.Write(row[:4*b.Dx()])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// judgeProbe says whether a task's two tries make it unfit, and why.
func judgeProbe(runs [2]TaskProbeRun) (reason, evidence string) {
	for i, r := range runs {
		switch {
		case r.ResetFailed:
			return schema.QuarantineSetupFails, fmt.Sprintf("try %d: %s", i+1, r.Error)
		case r.Error != "":
			return schema.QuarantineGraderFails, fmt.Sprintf("try %d: %s", i+1, r.Error)
		}
		for _, v := range []*float64{r.Reward, r.Again} {
			if v != nil && !(*v >= 0 && *v <= 1) {
				return schema.QuarantineRewardOutOfRange, fmt.Sprintf("try %d: the grader returned %v", i+1, *v)
			}
		}
		if r.Again != nil && *r.Again != *r.Reward {
			return schema.QuarantineGraderDisagrees, fmt.Sprintf("try %d: the start state graded %v, then %v", i+1, *r.Reward, *r.Again)
		}
	}
	if *runs[0].Reward != *runs[1].Reward {
		return schema.QuarantineGraderDisagrees, fmt.Sprintf("two fresh start states graded %v and %v", *runs[0].Reward, *runs[1].Reward)
	}
	if runs[0].Screen != runs[1].Screen {
		evidence = "two resets showed different first screens: the start state is not reproducible"
		for i, r := range runs {
			if r.UnsettledStart {
				evidence += fmt.Sprintf("; try %d's screen had not settled when the wait after the reset reached its bound (a program that keeps animating, or one still starting)", i+1)
			}
		}
		return schema.QuarantineReplayDiverges, evidence
	}
	// Partial credit too: any reward for doing nothing is one a policy
	// learns to collect.
	if r := *runs[0].Reward; r > 0 {
		evidence = fmt.Sprintf("the untouched start state scores %v without an action", r)
		if runs[0].Explain != "" {
			evidence += ": " + runs[0].Explain
		}
		return schema.QuarantineSolvedAtStart, evidence
	}
	return "", ""
}
