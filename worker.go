package rl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

// maxDesktopStarts bounds how often in a row a worker tries to create a
// desktop before it gives up its slot.
const maxDesktopStarts = 3

// worker owns one desktop slot for the whole batch.
type worker struct {
	b    *batch
	slot int
	desk desktop.Desktop
}

func (w *worker) run(ctx context.Context) {
	defer w.closeDesktop()
	failures := 0
	var lastErr error
	for {
		if w.desk == nil {
			// A replacement desktop may take minutes to boot: make none
			// when no attempt is left that could need it.
			if !w.b.workLeft(ctx) {
				return
			}
			if failures >= maxDesktopStarts {
				w.b.log.Error("worker gives up its slot: no desktop could be created",
					"slot", w.slot, "tries", failures, "err", lastErr)
				w.b.slotLost(fmt.Errorf("%w for slot %d after %d tries: %v", errNoDesktop, w.slot, failures, lastErr))
				return
			}
			d, err := w.b.opts.NewDesktop(ctx, w.slot)
			if err == nil && d == nil {
				err = errors.New("the desktop factory returned no desktop and no error")
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				lastErr = err
				w.b.log.Warn("create desktop", "slot", w.slot, "try", failures, "err", err)
				if !sleepCtx(ctx, time.Duration(failures)*time.Second) {
					return
				}
				continue
			}
			w.desk, failures = d, 0
		}
		a := w.b.next(ctx)
		if a == nil {
			return
		}
		rec, broken := w.attempt(ctx, a)
		if broken {
			w.closeDesktop()
		}
		if rec == nil {
			w.b.interrupted(a)
			continue
		}
		if err := w.b.end(a, rec); err != nil {
			return
		}
	}
}

func (w *worker) closeDesktop() {
	if w.desk == nil {
		return
	}
	if err := w.desk.Close(); err != nil {
		w.b.log.Warn("close desktop", "slot", w.slot, "err", err)
	}
	w.desk = nil
}

// attempt runs one try of a and returns its record, or nil when the batch
// stopped before the try ended (it leaves no record and runs again on
// resume). broken says the desktop failed and must be replaced.
func (w *worker) attempt(batchCtx context.Context, a *attempt) (rec *Record, broken bool) {
	b := w.b
	start := time.Now()
	rec = b.newRecord(a, w.slot, start)
	// attemptCtx is cancelled when the attempt's group closes.
	attemptCtx, cancel := context.WithCancel(batchCtx)
	defer cancel()
	if !b.setCancel(a, cancel) {
		// The group closed between next and here: the attempt never
		// touched the desktop.
		rec.Status = schema.StatusSkipped
		rec.Desktop = -1
		rec.EndedAt = schema.Time{Time: start}
		return rec, false
	}
	r := &rollout{w: w, a: a, rec: rec, task: a.g.task}
	status, err := r.run(attemptCtx)

	rec.EndedAt = schema.Time{Time: time.Now()}
	rec.Timing.TotalS = rec.EndedAt.Sub(start).Seconds()
	rec.NSteps = len(rec.Steps)
	switch {
	case err == nil && status != schema.StatusCancelled:
		// Graded: kept even when the batch was stopped meanwhile, since
		// the work is done.
		rec.Status = status
		return rec, false
	case batchCtx.Err() != nil:
		return nil, false
	case status == schema.StatusCancelled || b.wasCancelledByFull(a):
		rec.Status = schema.StatusCancelled
		rec.Reward = nil
		// A desktop that failed on its own just before the group closed
		// is still broken.
		return rec, err != nil && !errors.Is(err, context.Canceled) && desktopFailed(err)
	}
	rec.Reward = nil
	var pe *policyFailure
	switch {
	case errors.As(err, &pe) && (errors.Is(err, policy.ErrUnauthorized) || errors.Is(err, policy.ErrNotFound)):
		// Every other call would fail the same way: stop the batch rather
		// than burn through its attempts with error records, and leave
		// this attempt unrecorded so that it runs again once the key or
		// the model name is fixed.
		b.setFatal(fmt.Errorf("policy server refused the batch: %w", pe.err))
		return nil, false
	case errors.As(err, &pe):
		rec.Status = schema.StatusError
		rec.Error = &schema.ErrorInfo{Kind: schema.ErrorPolicy, Message: pe.err.Error()}
		return rec, false
	case errors.Is(err, desktop.ErrUnsupported), errors.Is(err, errBadReward):
		rec.Status = schema.StatusError
		rec.Error = &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: err.Error()}
		return rec, false
	}
	// A desktop failure (desktopFailed): replace the desktop, and re-queue
	// while tries are left.
	rec.Error = &schema.ErrorInfo{Kind: schema.ErrorEnv, Message: err.Error()}
	if a.tries+1 < b.maxTries() {
		rec.Status = schema.StatusRetried
	} else {
		rec.Status = schema.StatusError
	}
	b.log.Warn("desktop failed", "slot", w.slot, "task", a.g.task.ID, "attempt", a.index, "status", rec.Status, "err", err)
	return rec, true
}

// desktopFailed reports whether err, which ended a try, is a failure of
// the desktop rather than of the model call or of a task the desktop
// cannot run.
func desktopFailed(err error) bool {
	var pe *policyFailure
	return !errors.As(err, &pe) && !errors.Is(err, desktop.ErrUnsupported) && !errors.Is(err, errBadReward)
}

// policyFailure marks a model call that failed after its retries.
type policyFailure struct{ err error }

func (e *policyFailure) Error() string { return "policy: " + e.err.Error() }
func (e *policyFailure) Unwrap() error { return e.err }

var errBadReward = errors.New("reward out of [0, 1]")

// rollout is the step loop of one try.
type rollout struct {
	w    *worker
	a    *attempt
	rec  *Record
	task Task
	// stored is the last prompt put in the run store, as it was then, and
	// storedHashes its hashes.
	stored       []schema.Message
	storedHashes []string
}

// run resets the desktop, steps the agent and grades the result. It returns
// the status of a graded attempt (ok, truncated), StatusCancelled when its
// group closed, or the error that ended it: a *policyFailure, or a desktop
// error. Errors of calls made after ctx ended are returned as they are; the
// caller looks at the contexts to tell why.
func (r *rollout) run(ctx context.Context) (Status, error) {
	b := r.w.b
	d := r.w.desk
	t := &r.rec.Timing

	if err := timed(&t.ResetS, func() error { return d.Reset(ctx, r.task) }); err != nil {
		return "", fmt.Errorf("reset: %w", err)
	}
	if err := timed(&t.WaitAfterResetS, func() error { return d.WaitAfterReset(ctx) }); err != nil {
		return "", fmt.Errorf("wait after reset: %w", err)
	}

	stepCtx := ctx
	if b.opts.RolloutTimeout > 0 {
		var cancel context.CancelFunc
		stepCtx, cancel = context.WithTimeout(ctx, b.opts.RolloutTimeout)
		defer cancel()
	}
	status, err := r.steps(stepCtx)
	if err != nil {
		if ctx.Err() == nil && stepCtx.Err() != nil {
			// The rollout timeout stopped the stepping: grade as usual.
			status, err = schema.StatusTruncated, nil
		} else {
			return "", err
		}
	}
	if !b.startGrading(r.a) {
		return schema.StatusCancelled, nil
	}
	if err := timed(&t.WaitBeforeEvalS, func() error { return d.WaitBeforeEval(ctx) }); err != nil {
		return "", fmt.Errorf("wait before eval: %w", err)
	}
	var reward float64
	if err := timed(&t.EvalS, func() error {
		var err error
		reward, err = d.Evaluate(ctx, r.task)
		return err
	}); err != nil {
		return "", fmt.Errorf("evaluate: %w", err)
	}
	if reward < 0 || reward > 1 || reward != reward {
		return "", fmt.Errorf("evaluate: %w: the desktop returned %v", errBadReward, reward)
	}
	r.rec.Reward = &reward
	return status, nil
}

// steps runs the observe → model → act loop until the agent ends the
// attempt or MaxSteps model calls were made.
func (r *rollout) steps(ctx context.Context) (Status, error) {
	b := r.w.b
	d := r.w.desk
	t := &r.rec.Timing
	ep := b.harness.NewEpisode(r.task)

	var obs *desktop.Observation
	for range b.opts.MaxSteps {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if obs == nil {
			var o desktop.Observation
			if err := timed(&t.ObsS, func() (err error) { o, err = d.Observe(ctx); return err }); err != nil {
				return "", fmt.Errorf("observe: %w", err)
			}
			obs = &o
		}
		msgs, err := ep.Prompt(*obs)
		if err != nil {
			// The observation came from the desktop; a screenshot the
			// harness cannot use is the desktop's failure.
			return "", fmt.Errorf("prompt from observation: %w", err)
		}
		hashes, err := r.storePrompt(msgs)
		if err != nil {
			// Nothing the batch does could be kept: stop it. The stop
			// cancels ctx, so the attempt leaves no record.
			err = fmt.Errorf("store messages: %w", err)
			b.setFatal(err)
			return "", err
		}
		res, err := b.client.Complete(ctx, msgs)
		if res != nil {
			// A failed call still took its time; total_s should show it.
			t.QueueS += res.Model.QueueS
			t.ModelS += res.Model.Seconds
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", err
			}
			return "", &policyFailure{err}
		}
		step := schema.Step{
			Request:   hashes,
			StartedAt: schema.Time{Time: res.StartedAt},
			Response:  res.Response,
			Model:     res.Model,
			Warnings:  res.Warnings,
		}
		parsed := ep.Reply(policy.Reply{Content: res.Response.Content, Reasoning: res.Response.Reasoning, ToolCalls: res.ToolCalls})
		if parsed.Err != nil {
			step.ParseError = parsed.Err.Error()
		}
		r.rec.Steps = append(r.rec.Steps, step)
		cur := &r.rec.Steps[len(r.rec.Steps)-1]
		obs = nil
		if len(parsed.Actions) == 0 {
			continue
		}
		end, err := r.act(ctx, cur, parsed, &obs)
		if err != nil {
			return "", err
		}
		if end {
			break
		}
	}
	return schema.StatusOK, nil
}

// storePrompt puts the messages of a prompt in the run store and returns
// their hashes. A prompt usually extends the previous one, whose messages
// are stored already: only the messages that differ from it are hashed, so
// that a step costs the same however long its history (each message may
// hold a screenshot of a megabyte or two, which PutMessages would decode
// and hash again).
func (r *rollout) storePrompt(msgs []schema.Message) ([]string, error) {
	k := 0
	for k < len(msgs) && k < len(r.stored) && sameMessage(msgs[k], r.stored[k]) {
		k++
	}
	fresh, err := r.w.b.store.PutMessages(msgs[k:])
	if err != nil {
		return nil, err
	}
	// Clip: the hashes of the previous step are in its record.
	hashes := append(slices.Clip(r.storedHashes[:k]), fresh...)
	r.stored, r.storedHashes = snapshot(msgs), hashes
	return hashes, nil
}

// sameMessage reports whether a and b are the same message. Harnesses
// reuse the strings of their history, so equal long strings (image data
// URLs) are usually the same memory and compare in constant time.
func sameMessage(a, b schema.Message) bool {
	return a.Role == b.Role && slices.EqualFunc(a.Content, b.Content, func(p, q schema.Part) bool {
		if (p.ImageURL == nil) != (q.ImageURL == nil) || (p.ImageURL != nil && p.ImageURL.URL != q.ImageURL.URL) {
			return false
		}
		return p.Type == q.Type && p.Text == q.Text
	})
}

// snapshot copies msgs down to their strings, which are immutable, so that
// a harness changing its history in place cannot change what storePrompt
// compares against.
func snapshot(msgs []schema.Message) []schema.Message {
	out := make([]schema.Message, len(msgs))
	for i, m := range msgs {
		parts := make([]schema.Part, len(m.Content))
		for j, p := range m.Content {
			if p.ImageURL != nil {
				p.ImageURL = &schema.ImageURL{URL: p.ImageURL.URL}
			}
			parts[j] = p
		}
		out[i] = schema.Message{Role: m.Role, Content: parts}
	}
	return out
}

// act runs the actions of one reply, each followed by the wait until the
// screen is ready and an observation. It reports whether the agent ended
// the attempt.
func (r *rollout) act(ctx context.Context, step *schema.Step, p policy.Parsed, obs **desktop.Observation) (bool, error) {
	b := r.w.b
	d := r.w.desk
	t := &r.rec.Timing
	for i, action := range p.Actions {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ar := schema.ActionRecord{Action: action.String()}
		if i < len(p.Calls) {
			ar.Call = p.Calls[i]
		}
		var res desktop.ActResult
		err := timed(&ar.ActS, func() (err error) { res, err = d.Act(ctx, action); return err })
		t.ActS += ar.ActS
		if err != nil {
			step.Actions = append(step.Actions, ar)
			return false, fmt.Errorf("act %s: %w", shorten(action.String()), err)
		}
		if res.ExitCode != 0 {
			b.log.Debug("action failed in the guest", "task", r.task.ID, "exit", res.ExitCode, "stderr", shorten(res.Error))
		}
		if action.Terminal() {
			step.Actions = append(step.Actions, ar)
			return true, nil
		}
		o, err := b.waitReady(ctx, d, &ar)
		t.WaitS += ar.WaitS
		t.ObsS += ar.ObsS
		step.Actions = append(step.Actions, ar)
		if err != nil {
			return false, err
		}
		*obs = &o
	}
	return false, nil
}

// timed runs f and adds its duration, in seconds, to *acc.
func timed(acc *float64, f func() error) error {
	start := time.Now()
	err := f()
	*acc += time.Since(start).Seconds()
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func shorten(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		return s[:117] + "..."
	}
	return s
}

// newRolloutID returns an id unique across tries and batches that still
// tells a reader which task and attempt it belongs to.
func newRolloutID(taskID string, attempt int) string {
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	short := taskID
	if len(short) > 8 {
		short = short[:8]
	}
	return fmt.Sprintf("%s-a%d-%s", short, attempt, hex.EncodeToString(buf[:]))
}
