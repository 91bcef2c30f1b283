package osworld

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
)

var _ desktop.Stepper = (*Desktop)(nil)

// A step with the executor is one round trip: the executor runs the
// action, waits in the guest until the screen settled, takes the settled
// screen from the X server and encodes it (guestpy/shot.py), and answers
// with all of it. Without the executor, or where its screenshots cannot be
// trusted, a step is the action, the ready signal and GET /screenshot.

// shotLevel is the zlib level of the executor's PNGs. Measured in the
// test guest under software emulation on a 1920x1080 terminal screen
// (TestIntegrationShotEncoders, one thread): level 1 encoded in 0.19 s to
// 52 KB, a round trip of 0.47 s; level 6 (zlib's default) 0.27 s to 22 KB,
// 0.61 s; level 0 makes 6.2 MB that take 1.3 s to send.
const shotLevel = 1

// shotTrust says whether the executor's screenshots show what the guest
// server's GET /screenshot shows. It is a property of the guest server (how
// it draws the pointer), checked once per desktop on the first screenshot.
type shotTrust int

const (
	shotsUnchecked shotTrust = iota
	shotsAgree
	shotsDiffer
)

// shotChecks is how many times the executor's screenshots must differ
// from the guest server's on a still screen before the desktop stops
// trusting them.
const shotChecks = 2

// Step runs an action, waits until the screen is ready (at most max after
// the action) and returns the screen it ended on: with the executor, in
// one round trip. WAIT is the wait alone; a terminal action only counts as
// the attempt's last.
func (d *Desktop) Step(ctx context.Context, action desktop.Action, bound time.Duration) (desktop.StepResult, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.StepResult{}, err
	}
	defer done()
	d.pending = nil
	d.lastAction = action
	switch {
	case action.Terminal():
		return desktop.StepResult{}, nil
	case action.Kind != desktop.Code:
		// WAIT runs nothing: the wait for the screen is all of it.
		return d.stepWait(ctx, desktop.ActResult{}, 0, bound)
	}
	if req, ok := d.settleRequest(time.Now().Add(bound), waitFor{shot: true}); ok && d.executorWatches() {
		t0 := time.Now()
		res, a, actTime, ran, err := d.actExecutor(ctx, action.Code, &req)
		answered := time.Now()
		if ran || err != nil {
			act, err := d.actResult(ctx, res, err)
			if err != nil {
				return desktop.StepResult{Act: act}, d.fail("step", err)
			}
			if a == nil || a.Error != "" {
				// The action did not end normally, or the screen cannot be
				// watched: the ready signal as without the executor.
				if a != nil {
					d.noWatchAnymore(a.Error)
				}
				return d.stepWait(ctx, act, answered.Sub(t0), bound)
			}
			actEnd := t0.Add(actTime)
			r, err := d.readyFrom(ctx, *a, actEnd, answered, true, answered.Sub(t0)-actTime-seconds(a.Waited))
			if err != nil {
				return desktop.StepResult{Act: act}, d.fail("step", err)
			}
			// Settled or not: an unsettled step's After is its whole wait,
			// which the record marks as unsettled.
			r.After = seconds(a.Waited)
			wait := seconds(a.Waited)
			if r.Capture == 0 {
				// The screenshot came after the answer.
				wait = max(0, r.Observation.At.Sub(actEnd))
			}
			return desktop.StepResult{Act: act, Ready: r, ActTime: actTime, WaitTime: wait}, nil
		}
	}
	t0 := time.Now()
	act, err := d.act(ctx, action)
	if err != nil {
		return desktop.StepResult{Act: act}, err
	}
	return d.stepWait(ctx, act, time.Since(t0), bound)
}

// stepWait is the rest of a step whose action ran without the wait.
func (d *Desktop) stepWait(ctx context.Context, act desktop.ActResult, actTime, bound time.Duration) (desktop.StepResult, error) {
	start := time.Now()
	r, err := d.readySignal(ctx, bound, waitFor{shot: true})
	if err != nil {
		return desktop.StepResult{Act: act, ActTime: actTime}, d.fail("step", err)
	}
	return desktop.StepResult{Act: act, Ready: r, ActTime: actTime, WaitTime: max(0, r.Observation.At.Sub(start))}, nil
}

// settleRequest plans a settle request whose answer, and the screenshot
// after it when the executor does not take it, end by deadline; ok is
// false when there is no time left for one.
func (d *Desktop) settleRequest(deadline time.Time, w waitFor) (req executorRequest, ok bool) {
	cfg := d.cfg.Ready
	withShot := w.shot && d.shots != shotsDiffer
	est := d.waits.settle
	if withShot {
		est = d.waits.settleShot
	}
	overhead := max(est, minSettleOverhead)
	if est == 0 {
		overhead = firstSettleOverhead
		if withShot {
			overhead += d.waits.shot
		}
	}
	if w.shot && (!withShot || d.shots == shotsUnchecked) {
		// A screenshot from /screenshot follows: the only one, or the one
		// the executor's is checked against.
		overhead += d.waits.shot
	}
	wait := time.Until(deadline) - overhead
	if wait < 0 {
		return req, false
	}
	window := w.window
	if d.exec.window != "" {
		window = d.exec.window
	}
	req = executorRequest{Op: "settle", Max: max(wait.Seconds(), 1e-3), Interval: d.executorInterval(w).Seconds(),
		MaxLoad: cfg.MaxLoad, MaxDamage: cfg.MaxDamage, Window: window}
	if withShot {
		level := d.shotLevel()
		req.Shot = &level
	}
	return req, true
}

// shotLevel is the zlib level the executor's screenshots are encoded at.
func (d *Desktop) shotLevel() int {
	if d.testShotLevel != nil {
		return *d.testShotLevel
	}
	return shotLevel
}

// executorWatches says the ready signal is the executor's: it runs and can
// watch the screen, and no baseline asks for screenshot comparisons.
func (d *Desktop) executorWatches() bool {
	return d.exec.usable() && !d.exec.noWatch && !d.cfg.Ready.NoDamage && !d.noDamage
}

// waitExecutor is the ready signal with the executor watching the screen:
// one request that returns once the guest settled (or by the bound), with
// the settled screen when shot asks for one and the executor's
// screenshots are trusted, else followed by one screenshot. It reports
// done=false when no executor can watch the screen; the caller probes
// then.
func (d *Desktop) waitExecutor(ctx context.Context, start, deadline time.Time, w waitFor) (r desktop.Ready, err error, done bool) {
	if !d.executorWatches() {
		return desktop.Ready{}, nil, false
	}
	req, ok := d.settleRequest(deadline, w)
	if !ok {
		return desktop.Ready{}, nil, false
	}
	lastShot := time.Duration(0)
	if w.shot && (req.Shot == nil || d.shots == shotsUnchecked) {
		lastShot = d.waits.shot
	}
	pctx, cancel := context.WithDeadline(ctx, deadline.Add(-lastShot))
	defer cancel()
	t0 := time.Now()
	var a settleAnswer
	delivered, err := d.callExecutor(pctx, req, &a)
	answered := time.Now()
	switch {
	case err != nil && ctx.Err() == nil && pctx.Err() != nil:
		// Cut off at the bound: the screen as it is.
		a = settleAnswer{}
	case err != nil:
		return desktop.Ready{}, err, true
	case !delivered:
		return desktop.Ready{}, nil, false
	case a.Error != "":
		d.noWatchAnymore(a.Error)
		return desktop.Ready{}, nil, false
	}
	r, err = d.readyFrom(ctx, a, t0, answered, w.shot, answered.Sub(t0)-seconds(a.Waited))
	if err != nil {
		return desktop.Ready{}, err, true
	}
	if a.Settled {
		r.After = answered.Sub(start)
	} else {
		r.After = time.Since(start)
	}
	return r, nil, true
}

// noWatchAnymore notes that the executor cannot watch the screen.
func (d *Desktop) noWatchAnymore(why string) {
	d.log.Warn("the action executor cannot watch the screen; the ready signal probes the guest instead", "why", why)
	d.exec.noWatch = true
}

// readyFrom turns a settle answer into the Ready it means (After is left
// to the caller). waitStart is when the settle began on the host side,
// answered when its answer came; overhead is the answer's round trip
// beyond the guest's wait. With shot, the screen is the executor's
// screenshot where it took one the desktop trusts, else one taken now.
func (d *Desktop) readyFrom(ctx context.Context, a settleAnswer, waitStart, answered time.Time, shot bool, overhead time.Duration) (desktop.Ready, error) {
	r := desktop.Ready{Settled: a.Settled}
	if a.Waited > 0 || a.Settled {
		if len(a.PNG) > 0 {
			d.waits.settleShot = ewma(d.waits.settleShot, max(0, overhead))
		} else if a.ShotError == "" {
			d.waits.settle = ewma(d.waits.settle, max(0, overhead))
		}
		d.log.Debug("settle", "settled", a.Settled, "waited", a.Waited, "load", a.Load, "load_terms", a.LoadTerms, "damage", a.Damage, "repeated", a.Repeated,
			"held_load", a.HeldLoad, "held_damage", a.HeldDamage, "held_late", a.HeldLate, "late", a.Late, "overhead", overhead, "capture", a.CaptureS, "encode", a.EncodeS, "early", a.Early, "png", len(a.PNG))
	}
	if !shot {
		return r, nil
	}
	if obs, ok := d.executorShot(a, waitStart.Add(seconds(a.Waited))); ok {
		obs, trusted, err := d.trustShot(ctx, obs, a.Settled)
		if err != nil {
			return desktop.Ready{}, err
		}
		r.Observation = obs
		if trusted {
			r.Capture, r.Encode, r.ShotInWait = seconds(a.CaptureS), seconds(a.EncodeS), a.Early
		}
		return r, nil
	}
	obs, err := d.timedShot(ctx)
	if err != nil {
		return desktop.Ready{}, err
	}
	r.Observation = obs
	return r, nil
}

// executorShot is the screenshot of a settle answer, if it holds one the
// desktop may use; at is when it was taken, as near as the host knows.
// An executor that could not take one will not: the desktop stops asking.
func (d *Desktop) executorShot(a settleAnswer, at time.Time) (desktop.Observation, bool) {
	if d.shots == shotsDiffer {
		return desktop.Observation{}, false
	}
	why := a.ShotError
	if why == "" && len(a.PNG) == 0 {
		return desktop.Observation{}, false // cut off, or not asked for
	}
	if why == "" {
		cfg, err := png.DecodeConfig(bytes.NewReader(a.PNG))
		switch {
		case err != nil:
			why = fmt.Sprintf("not a PNG: %v", err)
		case cfg.Width != a.Width || cfg.Height != a.Height:
			why = fmt.Sprintf("a PNG of %dx%d said to be %dx%d", cfg.Width, cfg.Height, a.Width, a.Height)
		}
	}
	if why != "" {
		d.shots = shotsDiffer
		d.log.Warn("the action executor cannot take screenshots; they come from the guest server's /screenshot, one more round trip per step", "why", why)
		return desktop.Observation{}, false
	}
	return desktop.Observation{Screenshot: a.PNG, Width: a.Width, Height: a.Height, At: at}, true
}

// trustShot checks, until it knows, that the executor's screenshot shows
// what the guest server's /screenshot shows, pixel for pixel (the pointer
// drawn the same way): a trainer's data must not depend on which one took
// it. Until they agree once, every executor screenshot is followed by one
// from /screenshot and compared. When the two differ on a settled screen,
// the executor takes another right away: if that one agrees, they agree; if it differs from
// its first, the screen changed meanwhile (a blinking caret) and nothing is
// concluded; if the executor's two agree with each other and not with the
// server's, the two draw the screen differently, and after shotChecks such
// pairs the desktop takes every screenshot from /screenshot, and says so.
// It returns the observation to use and whether it is the executor's.
func (d *Desktop) trustShot(ctx context.Context, mine desktop.Observation, settled bool) (desktop.Observation, bool, error) {
	if d.shots == shotsAgree {
		return mine, true, nil
	}
	theirs, err := d.timedShot(ctx)
	if err != nil {
		return desktop.Observation{}, false, err
	}
	why, err := diffPixels(mine.Screenshot, theirs.Screenshot)
	if err == nil && why != "" && !settled {
		// A screen still changing tells nothing, and a second look would
		// run past the wait's bound.
		return theirs, false, nil
	}
	if err == nil && why != "" {
		var a settleAnswer
		level := d.shotLevel()
		delivered, cerr := d.callExecutor(ctx, executorRequest{Op: "settle", Max: 1e-3, Interval: d.cfg.Ready.ExecutorInterval.Seconds(),
			MaxLoad: 1, MaxDamage: 1, Shot: &level}, &a)
		if cerr != nil {
			return desktop.Observation{}, false, cerr
		}
		again, ok := d.executorShot(a, time.Now())
		if !delivered || !ok {
			return theirs, false, nil // no verdict from this
		}
		if w, _ := diffPixels(again.Screenshot, theirs.Screenshot); w == "" {
			mine, why = again, ""
		} else if w, _ := diffPixels(again.Screenshot, mine.Screenshot); w != "" {
			return theirs, false, nil // the screen changes: no verdict
		}
	}
	switch {
	case err == nil && why == "":
		d.shots = shotsAgree
		d.log.Debug("the action executor's screenshots agree with the guest server's", "differed", d.shotDiffs)
		return mine, true, nil
	case err != nil:
		why = err.Error()
		d.shotDiffs = shotChecks
	default:
		d.shotDiffs++
	}
	if d.shotDiffs >= shotChecks {
		d.shots = shotsDiffer
		d.log.Warn("the action executor's screenshots differ from the guest server's /screenshot (its pointer drawn another way?); "+
			"screenshots come from /screenshot, one more round trip per step", "why", why)
	}
	return theirs, false, nil
}

// diffPixels says how two PNGs differ in their pixels ("" when they show
// the same), whatever their encodings (color types, compression).
func diffPixels(a, b []byte) (string, error) {
	ia, err := png.Decode(bytes.NewReader(a))
	if err != nil {
		return "", fmt.Errorf("decode the executor's screenshot: %w", err)
	}
	ib, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("decode the guest server's screenshot: %w", err)
	}
	if ia.Bounds() != ib.Bounds() {
		return fmt.Sprintf("sizes %v and %v", ia.Bounds().Size(), ib.Bounds().Size()), nil
	}
	pa, pb := rgb(ia), rgb(ib)
	n, first := 0, -1
	for i := 0; i < len(pa); i += 3 {
		if pa[i] != pb[i] || pa[i+1] != pb[i+1] || pa[i+2] != pb[i+2] {
			if first < 0 {
				first = i / 3
			}
			n++
		}
	}
	if n == 0 {
		return "", nil
	}
	w := ia.Bounds().Dx()
	return fmt.Sprintf("%d pixels differ, the first at (%d, %d)", n, first%w, first/w), nil
}

// rgb returns the pixels of an opaque image as R, G, B bytes.
func rgb(img image.Image) []byte {
	b := img.Bounds()
	out := make([]byte, 0, b.Dx()*b.Dy()*3)
	var pix []byte // 4 bytes a pixel, R, G, B first: what PNG decodes to
	switch m := img.(type) {
	case *image.RGBA:
		pix = m.Pix
	case *image.NRGBA:
		pix = m.Pix
	}
	if pix != nil {
		for i := 0; i < len(pix); i += 4 {
			out = append(out, pix[i], pix[i+1], pix[i+2])
		}
		return out
	}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			out = append(out, byte(r>>8), byte(g>>8), byte(bl>>8))
		}
	}
	return out
}

// actResult is what an action's run through the guest comes to: a program
// that failed in the guest, or that the guest refused to run (its 120 s
// limit), is an ActResult with a non-zero exit code, not an error.
func (d *Desktop) actResult(ctx context.Context, res guest.ExecResult, err error) (desktop.ActResult, error) {
	var gerr *guest.Error
	if err != nil && errors.As(err, &gerr) && gerr.Status != 0 && ctx.Err() == nil {
		// The guest answered: it is up, the action is what failed.
		return desktop.ActResult{ExitCode: -1, Error: err.Error()}, nil
	}
	if err != nil {
		return desktop.ActResult{}, err
	}
	return desktop.ActResult{ExitCode: res.ReturnCode, Output: res.Output, Error: res.Error}, nil
}
