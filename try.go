package rl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/schema"
)

// maxCallsWhileUp bounds how often a model call that failed like a broken
// server is sent again when the server then served the breaker's first
// one-token generation: the server serves, so the call itself may be what
// fails (a prompt that crashes the engine). Two resends: a server that
// drops one request in three, with the tiny generation served in between,
// still fails a call only once in 27, not once in 9; a call that fails
// every time costs three sends. Resends after a ping failed are not
// bounded by it: the server was broken, not the call.
const maxCallsWhileUp = 2

// try is one try of an attempt on one desktop: reset, then steps until the
// agent ends it, then grading. It gathers the record's content and says how
// it ended; what status that makes is decide's.
type try struct {
	b    *batch
	d    desktop.Desktop
	a    *attempt
	task Task
	rec  *Record
	// stored is the last prompt put in the run store, as it was then, and
	// storedHashes its hashes.
	stored       []schema.Message
	storedHashes []string
	// promptIDs stores the prompts' token ids, each sharing the chunks of
	// the one before; nil until the first.
	promptIDs *schema.TokenWriter
	// clock is the rollout timeout's; nil without one.
	clock *rolloutClock
}

// desktopError is a desktop call's error with its class, judged when the
// call returned (desktop.IsFailure): the ctx may be done by the time the
// try ends.
type desktopError struct {
	err    error
	failed bool
}

func (e *desktopError) Error() string { return e.err.Error() }
func (e *desktopError) Unwrap() error { return e.err }

// desk wraps the error of a desktop call made with ctx.
func desk(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	return &desktopError{err: fmt.Errorf("%s: %w", op, err), failed: desktop.IsFailure(ctx, err)}
}

// runTry runs one try of a on d (slot's desktop) and returns its record,
// its status left to decide, and how it ended.
func (b *batch) runTry(batchCtx context.Context, d desktop.Desktop, a *attempt, slot int) (*Record, ending) {
	start := time.Now()
	rec := b.newRecord(a, slot, start)
	// ctx is cancelled, with errGroupClosed, when the attempt's group
	// closes.
	ctx, cancel := context.WithCancelCause(batchCtx)
	defer cancel(nil)
	n, open := b.sched.setCancel(a, cancel)
	if !open {
		// The group closed between next and here: the attempt never
		// touched the desktop.
		rec.Desktop = -1
		rec.EndedAt = schema.Time{Time: start}
		return rec, ending{}
	}
	ctx = desktop.WithAttempt(ctx, desktop.Attempt{GroupID: a.g.id, TaskID: a.g.task.ID, Index: a.index, Try: n})
	rec.Try = n
	t := &try{b: b, d: d, a: a, task: a.g.task, rec: rec}
	e := t.run(ctx)
	e.stopped = batchCtx.Err() != nil

	rec.EndedAt = schema.Time{Time: time.Now()}
	rec.Timing.TotalS = rec.EndedAt.Sub(start).Seconds()
	rec.NSteps = len(rec.Steps)
	if r, ok := d.(desktop.Reporter); ok {
		rec.Env = envReport(r.AttemptReport())
	}
	if !e.graded {
		rec.Reward = nil
	}
	return rec, e
}

func envReport(r desktop.AttemptReport) *schema.EnvReport {
	if r.Reset == "" && r.ResetWhy == "" && r.Golden == "" && len(r.Grading) == 0 && r.Host == "" && r.VM == "" && len(r.Ended) == 0 && len(r.Spared) == 0 && !r.UnsettledStart {
		return nil
	}
	env := &schema.EnvReport{Reset: r.Reset, ResetWhy: r.ResetWhy, Golden: r.Golden, Host: r.Host, VM: r.VM,
		Ended: processes(r.Ended), Spared: processes(r.Spared), UnsettledStart: r.UnsettledStart}
	for _, m := range r.Grading {
		env.Grading = append(env.Grading, schema.MetricRun{Metric: m.Metric, Via: m.Via, ResultSHA256: m.Result, ExpectedSHA256: m.Expected})
	}
	return env
}

func processes(ps []desktop.Process) []schema.Process {
	var out []schema.Process
	for _, p := range ps {
		out = append(out, schema.Process{PID: p.PID, Name: p.Name, UID: p.UID})
	}
	return out
}

// run resets the desktop, steps the agent and grades the result.
func (t *try) run(ctx context.Context) ending {
	b, d, tm := t.b, t.d, &t.rec.Timing
	ended := func(err error) ending {
		e := ending{started: true, err: err}
		var de *desktopError
		if errors.As(err, &de) {
			e.desktopFailed = de.failed
		}
		return e
	}
	if err := timed(&tm.ResetS, func() error { return desk(ctx, "reset", d.Reset(ctx, t.task)) }); err != nil {
		e := ended(err)
		e.resetFailed = true
		return e
	}
	if err := timed(&tm.WaitAfterResetS, func() error { return desk(ctx, "wait after reset", d.WaitAfterReset(ctx)) }); err != nil {
		return ended(err)
	}

	stepCtx, clock := startRolloutClock(ctx, b.opts.RolloutTimeout)
	defer clock.stop()
	t.clock = clock
	truncated := false
	if err := t.steps(stepCtx); err != nil {
		if ctx.Err() != nil || !errors.Is(context.Cause(stepCtx), errRolloutTimeout) {
			return ended(err)
		}
		// The rollout timeout stopped the stepping: grade as usual.
		truncated = true
	}
	if !b.sched.startGrading(t.a) {
		return ended(errGroupClosed)
	}
	if err := timed(&tm.WaitBeforeEvalS, func() error { return desk(ctx, "wait before eval", d.WaitBeforeEval(ctx)) }); err != nil {
		return ended(err)
	}
	if b.opts.KeepEndStates {
		t.keepEndState(ctx)
	}
	var reward float64
	if err := timed(&tm.EvalS, func() (err error) {
		reward, err = d.Evaluate(ctx, t.task)
		return desk(ctx, "evaluate", err)
	}); err != nil {
		return ended(err)
	}
	if reward < 0 || reward > 1 || reward != reward {
		return ended(fmt.Errorf("evaluate: %w: the desktop returned %v", errBadReward, reward))
	}
	t.rec.Reward = &reward
	failed := t.secondGrade(ctx, reward)
	return ending{started: true, graded: true, truncated: truncated, desktopFailed: failed}
}

// steps runs the observe → model → act loop until the agent ends the
// attempt or MaxSteps model calls were made.
func (t *try) steps(ctx context.Context) error {
	b, d, tm := t.b, t.d, &t.rec.Timing
	h := b.harness
	if t.a.g.harness != nil {
		h = t.a.g.harness
	}
	ep := h.NewEpisode(t.task)
	var obs *desktop.Observation
	for range b.opts.MaxSteps {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if obs == nil {
			var o desktop.Observation
			if err := timed(&tm.ObsS, func() (err error) { o, err = d.Observe(ctx); return desk(ctx, "observe", err) }); err != nil {
				return err
			}
			obs = &o
		}
		msgs, err := ep.Prompt(*obs)
		if err != nil {
			// The observation came from the desktop; a screenshot the
			// harness cannot use is the desktop's failure.
			return &desktopError{err: fmt.Errorf("prompt from observation: %w", err), failed: true}
		}
		// A stopping batch starts no model call, so it stores no prompt
		// for one either: at thousands of desktops that work alone held
		// the shutdown up for seconds.
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		// The prompt is stored (its new screenshot hashed and written)
		// while the model answers, not between the screenshot and the
		// request.
		type storeResult struct {
			hashes []string
			err    error
		}
		stored := make(chan storeResult, 1)
		go func() {
			h, err := t.storePrompt(msgs)
			stored <- storeResult{h, err}
		}()
		res, version, downS, err := t.call(ctx, msgs)
		st := <-stored
		if err != nil {
			return err
		}
		if st.err != nil {
			return &storeFailure{fmt.Errorf("store messages: %w", st.err)}
		}
		hashes := st.hashes
		if res.WeightVersion != "" {
			// The server's own word on the weights that generated it.
			version = res.WeightVersion
		}
		step := schema.Step{
			Request:       hashes,
			PolicyVersion: version,
			StartedAt:     schema.Time{Time: res.StartedAt},
			Response:      res.Response,
			Model:         res.Model,
			Warnings:      res.Warnings,
			ServerDownS:   downS,
		}
		if len(res.PromptTokenIDs) > 0 {
			if t.promptIDs == nil {
				t.promptIDs = b.store.NewTokenWriter()
			}
			if step.PromptTokenChunks, err = t.promptIDs.Put(res.PromptTokenIDs); err != nil {
				return &storeFailure{fmt.Errorf("store prompt token ids: %w", err)}
			}
			step.PromptTokenCount = len(res.PromptTokenIDs)
		}
		parsed := ep.Reply(policy.Reply{Content: res.Response.Content, Reasoning: res.Response.Reasoning, ToolCalls: res.ToolCalls})
		if parsed.Err != nil {
			step.ParseError = parsed.Err.Error()
		}
		t.rec.Steps = append(t.rec.Steps, step)
		cur := &t.rec.Steps[len(t.rec.Steps)-1]
		obs = nil
		if len(parsed.Actions) == 0 {
			continue
		}
		end, err := t.act(ctx, cur, parsed, &obs)
		if err != nil || end {
			return err
		}
	}
	return nil
}

// call makes a step's model call. A call that fails the way a broken
// server fails is sent again once the server serves (the batch's outage
// breaker waits for that, with the rollout clock stopped); downS is the
// time the step waited for it. The result's Model.Attempts counts every
// HTTP request the step made, over the resends too: retried_calls counts
// the steps with more than one.
func (t *try) call(ctx context.Context, msgs []schema.Message) (res *policy.Result, version string, downS float64, err error) {
	b, tm := t.b, &t.rec.Timing
	sent := 0 // HTTP requests of the earlier sends
	wait := func(f func() (time.Duration, error)) error {
		t.clock.pause()
		waited, err := f()
		t.clock.resume()
		downS += waited.Seconds()
		tm.ServerDownS += waited.Seconds()
		return err
	}
	for whileUp := 0; ; {
		// A paused policy (a trainer swapping weights) holds the call,
		// with the rollout clock stopped; the version in force when it
		// goes is the step's.
		t.clock.pause()
		v, held, err := b.gate.enter(ctx)
		t.clock.resume()
		tm.PausedS += held.Seconds()
		if err != nil {
			return nil, "", downS, err
		}
		version = v
		// Fetched after the gate: a trainer that paused to move the
		// policy to other servers resumes with the calls going there.
		srv := b.server(t.a)
		var outage time.Duration
		if err := wait(func() (time.Duration, error) { w, err := srv.outage.pause(ctx); outage = w; return w, err }); err != nil {
			b.gate.leave()
			if ctx.Err() == nil && b.movedFrom(t.a, srv) {
				continue
			}
			return nil, "", downS, srv.gaveUp(ctx, err)
		}
		if outage > 0 {
			// It waited out an outage, during which a trainer may have
			// paused, drained and served other weights: through the
			// gate again, for the version in force now.
			b.gate.leave()
			continue
		}
		res, err := srv.client.Complete(ctx, t.a.g.id, msgs)
		b.gate.leave()
		if res != nil {
			// A failed call still took its time; total_s should show it.
			tm.QueueS += res.Model.QueueS
			tm.ModelS += res.Model.Seconds
			res.Model.Attempts += sent
			sent = res.Model.Attempts
		}
		switch {
		case err == nil:
			return res, version, downS, nil
		case ctx.Err() != nil:
			return nil, "", downS, context.Cause(ctx)
		case !policy.IsOutage(err):
			return nil, "", downS, &policyFailure{err: err, own: srv.own}
		}
		var down bool
		cause := err
		if werr := wait(func() (w time.Duration, err error) { down, w, err = srv.outage.failed(ctx, cause); return w, err }); werr != nil {
			if ctx.Err() == nil && b.movedFrom(t.a, srv) {
				// The policy moved while the call failed or waited: it
				// goes again, to the new servers.
				continue
			}
			return nil, "", downS, srv.gaveUp(ctx, werr)
		}
		if !down {
			if whileUp >= maxCallsWhileUp {
				return nil, "", downS, &policyFailure{err: err, own: srv.own}
			}
			whileUp++
		}
	}
}

// storePrompt puts the messages of a prompt in the run store and returns
// their hashes. A prompt usually extends the previous one, whose messages
// are stored already: only the messages that differ from it are hashed, so
// that a step costs the same however long its history (each message may
// hold a screenshot of a megabyte or two, which PutMessages would decode
// and hash again).
func (t *try) storePrompt(msgs []schema.Message) ([]string, error) {
	k := 0
	for k < len(msgs) && k < len(t.stored) && sameMessage(msgs[k], t.stored[k]) {
		k++
	}
	fresh, err := t.b.store.PutMessages(msgs[k:])
	if err != nil {
		return nil, err
	}
	// Clip: the hashes of the previous step are in its record.
	hashes := append(slices.Clip(t.storedHashes[:k]), fresh...)
	t.stored, t.storedHashes = snapshot(msgs), hashes
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

// act runs the reply's actions through the stepping replay shares
// (actions.go), adding their phases to the record's timing.
func (t *try) act(ctx context.Context, step *schema.Step, p policy.Parsed, obs **desktop.Observation) (bool, error) {
	run := actionRun{d: t.d, ready: t.b.opts.Ready, log: t.b.log, taskID: t.task.ID}
	return run.actions(ctx, p.Actions, p.Calls, step, &t.rec.Timing, obs)
}

// timed runs f and adds its duration, in seconds, to *acc.
func timed(acc *float64, f func() error) error {
	start := time.Now()
	err := f()
	*acc += time.Since(start).Seconds()
	return err
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

// errRolloutTimeout is the cause of a stepping ctx the rollout timeout
// ended.
var errRolloutTimeout = errors.New("rollout timeout")

// rolloutClock is the rollout timeout of one try. It stops while the try
// waits for an absent model server, which is not the attempt's time.
type rolloutClock struct {
	timer  *time.Timer
	cancel context.CancelCauseFunc
	left   time.Duration
	since  time.Time
}

// startRolloutClock returns ctx cancelled with errRolloutTimeout after d of
// running clock; d ≤ 0 means no timeout (a nil clock, whose methods do
// nothing).
func startRolloutClock(ctx context.Context, d time.Duration) (context.Context, *rolloutClock) {
	if d <= 0 {
		return ctx, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c := &rolloutClock{left: d, since: time.Now(), cancel: cancel}
	c.timer = time.AfterFunc(d, func() { cancel(errRolloutTimeout) })
	return ctx, c
}

func (c *rolloutClock) pause() {
	if c != nil && c.timer.Stop() {
		c.left -= time.Since(c.since)
	}
}

func (c *rolloutClock) resume() {
	switch {
	case c == nil:
	case c.left <= 0:
		// The deadline passed just before the pause stopped the timer.
		c.cancel(errRolloutTimeout)
	default:
		c.since = time.Now()
		c.timer.Reset(c.left)
	}
}

func (c *rolloutClock) stop() {
	if c != nil {
		c.timer.Stop()
		c.cancel(context.Canceled)
	}
}

// secondGrade grades the end state just graded once more, when the batch
// grades twice and this try is among those it picks, and records what the
// second grade said. A desktop that failed on it is reported for
// replacement; the first grade stands.
func (t *try) secondGrade(ctx context.Context, reward float64) (desktopFailed bool) {
	if !pickedForSecondGrade(t.rec.RolloutID, t.b.opts.GradeTwice) {
		return false
	}
	g := &schema.SecondGrade{}
	t.rec.SecondGrade = g
	r, ok := t.d.(desktop.Regrader)
	if !ok {
		g.Error = "the desktop cannot grade an end state again (it is not a desktop.Regrader)"
		return false
	}
	var again float64
	err := timed(&t.rec.Timing.EvalS, func() (err error) {
		again, err = r.EvaluateAgain(ctx, t.task)
		return err
	})
	switch {
	case err != nil:
		g.Error = err.Error()
		return desktop.IsFailure(ctx, err)
	case again < 0 || again > 1 || again != again:
		g.Error = fmt.Sprintf("%v: the desktop returned %v", errBadReward, again)
		return false
	}
	g.Reward, g.Agrees = &again, again == reward
	return false
}

// pickedForSecondGrade reports whether the attempt rolloutID is among the
// fraction of attempts graded twice: picked by a hash of its id, so the
// pick spreads over tasks and attempts.
func pickedForSecondGrade(rolloutID string, fraction float64) bool {
	switch {
	case fraction <= 0:
		return false
	case fraction >= 1:
		return true
	}
	h := fnv.New64a()
	h.Write([]byte(rolloutID))
	return float64(h.Sum64()>>11)/(1<<53) < fraction
}
