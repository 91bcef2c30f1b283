package rl

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"legato/rl/desktop"
	"legato/rl/schema"
)

// actionRun is the stepping an attempt and its replay share: the actions of
// one model reply run on a desktop, each followed by the wait until the
// screen is ready (or in one call of a desktop.Stepper), timed into the
// step's action records. Replay runs a recorded step's actions through it,
// so that a replay waits and observes as the attempt did.
type actionRun struct {
	d      desktop.Desktop
	ready  desktop.ReadyOptions
	log    *slog.Logger
	taskID string
}

// actions runs actions, appending a record of each to step.Actions (calls
// are the model's calls they were parsed from, where known) and adding
// their phases to tm; *obs becomes the observation to continue from. It
// reports whether the agent ended the attempt.
func (r actionRun) actions(ctx context.Context, actions []desktop.Action, calls []json.RawMessage, step *schema.Step, tm *schema.Timing, obs **desktop.Observation) (bool, error) {
	for i, action := range actions {
		if err := ctx.Err(); err != nil {
			return false, context.Cause(ctx)
		}
		ar := schema.ActionRecord{Action: action.String()}
		if i < len(calls) {
			ar.Call = calls[i]
		}
		if st, ok := r.d.(desktop.Stepper); ok && !action.Terminal() {
			o, err := r.step(ctx, st, action, &ar)
			tm.ActS += ar.ActS
			tm.WaitS += ar.WaitS
			tm.ObsS += ar.ObsS
			step.Actions = append(step.Actions, ar)
			if err != nil {
				return false, err
			}
			*obs = &o
			continue
		}
		var res desktop.ActResult
		err := timed(&ar.ActS, func() (err error) { res, err = r.d.Act(ctx, action); return err })
		tm.ActS += ar.ActS
		if err != nil {
			step.Actions = append(step.Actions, ar)
			return false, desk(ctx, "act "+shorten(action.String()), err)
		}
		if res.ExitCode != 0 {
			r.log.Debug("action failed in the guest", "task", r.taskID, "exit", res.ExitCode, "stderr", shorten(res.Error))
		}
		if action.Terminal() {
			step.Actions = append(step.Actions, ar)
			return true, nil
		}
		o, err := r.waitReady(ctx, &ar)
		tm.WaitS += ar.WaitS
		tm.ObsS += ar.ObsS
		step.Actions = append(step.Actions, ar)
		if err != nil {
			return false, err
		}
		*obs = &o
	}
	return false, nil
}

// step runs an action, the wait until the screen is ready and the
// screenshot in one call of a desktop that does them in one go, and fills
// ar's phases from what it measured: act_s, wait_s (from the end of the
// action until the screenshot) and obs_s (the rest of the call: the
// screenshot, and where it was taken in the guest, its capture, encoding
// and the round trip), so that they add up to the call's time.
func (r actionRun) step(ctx context.Context, st desktop.Stepper, action desktop.Action, ar *schema.ActionRecord) (desktop.Observation, error) {
	start := time.Now()
	res, err := st.Step(ctx, action, r.ready.WithDefaults().Max)
	total := time.Since(start)
	actT := min(res.ActTime, total)
	waitT := min(res.WaitTime, total-actT)
	ar.ActS, ar.WaitS = actT.Seconds(), waitT.Seconds()
	ar.ObsS = (total - actT - waitT).Seconds()
	if err != nil {
		return desktop.Observation{}, desk(ctx, "step "+shorten(action.String()), err)
	}
	if res.Act.ExitCode != 0 {
		r.log.Debug("action failed in the guest", "task", r.taskID, "exit", res.Act.ExitCode, "stderr", shorten(res.Act.Error))
	}
	rd := res.Ready
	ar.ReadyS = rd.After.Seconds()
	ar.Unsettled = !rd.Settled && rd.After > 0
	if rd.Capture > 0 || rd.Encode > 0 {
		// The screenshot's parts lie within the phase they ran in: the
		// wait's, or the rest of the call's.
		in := total - actT - waitT
		if rd.ShotInWait {
			in = waitT
			ar.ShotInWait = true
		}
		capture := min(rd.Capture, in)
		ar.CaptureS, ar.EncodeS = capture.Seconds(), min(rd.Encode, in-capture).Seconds()
		ar.TransferS = ar.ObsS
		if !rd.ShotInWait {
			ar.TransferS = max(0, ar.ObsS-ar.CaptureS-ar.EncodeS)
		}
	}
	return rd.Observation, nil
}

// waitReady waits after an action until the screen is ready and returns the
// observation the wait ended on. It fills ar's wait_s (from the end of the
// action to the request of that screenshot), ready_s (from the end of the
// action until the screen was found ready) and obs_s (that screenshot), so
// that wait_s and obs_s never overlap.
func (r actionRun) waitReady(ctx context.Context, ar *schema.ActionRecord) (desktop.Observation, error) {
	start := time.Now()
	rd, err := desktop.WaitReady(ctx, r.d, r.ready)
	end := time.Now()
	if err != nil {
		ar.WaitS = end.Sub(start).Seconds()
		return desktop.Observation{}, desk(ctx, "wait ready", err)
	}
	at := rd.Observation.At
	if at.IsZero() || at.Before(start) || at.After(end) {
		at = end
	}
	ar.ReadyS = rd.After.Seconds()
	// A fixed sleep neither looks nor knows (After is 0): only a wait that
	// looked and ran out is unsettled.
	ar.Unsettled = !rd.Settled && rd.After > 0
	ar.WaitS = at.Sub(start).Seconds()
	ar.ObsS = end.Sub(at).Seconds()
	return rd.Observation, nil
}
