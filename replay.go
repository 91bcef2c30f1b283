package rl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/internal/backoff"
	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// ReplayVersion is the value of replay.json's "schema" field.
const ReplayVersion = "legato.replay/v0"

// ReplayFile is the name of the report Replay's command writes into the
// run directory.
const ReplayFile = schema.ReplayFile

// ReplayOptions says how Replay runs.
type ReplayOptions struct {
	// NewDesktop creates the desktops the attempts are replayed on: the
	// same backend, image and settings as the batch's, or the start
	// states differ. Required.
	NewDesktop desktop.Factory
	// Desktops is how many attempts are replayed at once (default 1).
	Desktops int
	// Tasks are the batch's tasks; each replayed record's task must be
	// among them with the config it ran (its task_sha256).
	Tasks []Task
	// Rollouts names the attempts to replay; empty means every graded
	// one (ok, truncated, surplus).
	Rollouts []string
	// Harness renders a screenshot as the batch's prompts did, so the
	// replayed screen compares byte for byte with the recorded one; it
	// must describe itself as batch.json's harness (default: the default
	// harness of Collect).
	Harness policy.Harness
	// Ready configures the wait after each action, as Collect's.
	Ready desktop.ReadyOptions
	// RecordedPace waits, before each step's actions, as long as the
	// recorded model call took, so the screen has the time it had when
	// the agent acted; without it the actions follow each other as soon
	// as the screen is ready.
	RecordedPace bool
	// Quarantine is a task quarantine file shared across batches: a task
	// whose replays do not reproduce their first screen goes into it, and
	// into the run directory's quarantine.json.
	Quarantine string
	Logger     *slog.Logger
}

// ReplayReport is what a replay found: replay.json.
type ReplayReport struct {
	Schema    string      `json:"schema"`
	Run       string      `json:"run"`
	StartedAt schema.Time `json:"started_at"`
	EndedAt   schema.Time `json:"ended_at"`
	// Attempts are the replayed attempts, in the order of the records.
	Attempts []AttemptReplay `json:"attempts"`
	// Totals over Attempts: those replayed to their grade, those whose
	// reward came out the same, the screens compared and those
	// identical byte for byte.
	Replayed         int `json:"replayed"`
	RewardsAgree     int `json:"rewards_agree"`
	Screens          int `json:"screens"`
	ScreensIdentical int `json:"screens_identical"`
	// RecordedS and ReplayS sum the attempts' time then and now, each
	// from its reset to its grade.
	RecordedS float64 `json:"recorded_s"`
	ReplayS   float64 `json:"replay_s"`
	// Quarantined names the tasks whose replays did not reproduce their
	// first screen.
	Quarantined []string `json:"quarantined,omitempty"`
}

// AttemptReplay is one attempt's replay.
type AttemptReplay struct {
	RolloutID string `json:"rollout_id"`
	TaskID    string `json:"task_id"`
	// RecordedReward and ReplayedReward are the grades then and now;
	// RewardAgrees says they are equal.
	RecordedReward *float64 `json:"recorded_reward"`
	ReplayedReward *float64 `json:"replayed_reward"`
	RewardAgrees   bool     `json:"reward_agrees"`
	// Screens compares each step's recorded screenshot with the replayed
	// one, in step order; FirstDivergence is the first step whose screen
	// differs, -1 when none does.
	Screens          []ScreenMatch `json:"screens"`
	ScreensIdentical int           `json:"screens_identical"`
	FirstDivergence  int           `json:"first_divergence"`
	// Golden is the key of the golden state both runs started from, when
	// the attempt started from one.
	Golden    string  `json:"golden,omitempty"`
	RecordedS float64 `json:"recorded_s"`
	ReplayS   float64 `json:"replay_s"`
	// Error says why the replay did not reach a grade.
	Error string `json:"error,omitempty"`
}

// ScreenMatch compares a step's screenshot then and now.
type ScreenMatch struct {
	Step      int  `json:"step"`
	Identical bool `json:"identical"`
	// Distance is the share of pixels that differ (0 when identical, 1
	// when the sizes differ).
	Distance float64 `json:"distance"`
	Recorded string  `json:"recorded"`
	Replayed string  `json:"replayed"`
}

// ErrReplay is wrapped by Replay's errors about its input.
var ErrReplay = errors.New("replay")

// Replay runs recorded attempts of the run directory runDir again, without
// a model: each from its start state (the same golden state where it had
// one), with its recorded actions, comparing every step's screen with the
// recorded one, and grades the end. It returns the report; the error is
// about the input (a rollout not in the run, a task that changed), not
// about attempts that did not replay (their Error says why).
func Replay(ctx context.Context, runDir string, opts ReplayOptions) (*ReplayReport, error) {
	if opts.NewDesktop == nil {
		return nil, fmt.Errorf("%w: no desktops: set ReplayOptions.NewDesktop", ErrReplay)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Ready = opts.Ready.WithDefaults()
	if opts.Harness == nil {
		opts.Harness = qwen.New(qwen.Config{ImageMax: DefaultImageMax})
	}
	if m, err := readManifest(runDir); err != nil {
		return nil, err
	} else if m == nil {
		return nil, fmt.Errorf("%w: %s holds no batch (no %s)", ErrReplay, runDir, schema.BatchFile)
	} else if h := harnessDescription(opts.Harness); m.Harness != "" && h != m.Harness {
		return nil, fmt.Errorf("%w: the batch's prompts were made by the harness %q, this replay's is %q: replay with the batch's --harness and --image-max, or screens cannot compare", ErrReplay, m.Harness, h)
	}
	recs, err := replayRecords(runDir, opts)
	if err != nil {
		return nil, err
	}
	// Read before the replay runs: a quarantine file that is not one is
	// refused before any desktop starts.
	quar, err := openQuarantine(runDir, opts.Quarantine, DefaultQuarantineSetupFails, opts.Logger)
	if err != nil {
		return nil, err
	}
	store, err := schema.OpenMessageStore(runDir, schema.StoreOptions{})
	if err != nil {
		return nil, err
	}
	defer store.Close()

	rep := &ReplayReport{Schema: ReplayVersion, Run: runDir, StartedAt: schema.Time{Time: time.Now()},
		Attempts: make([]AttemptReplay, len(recs))}
	r := &replayer{opts: opts, store: store, tasks: taskIndex(opts.Tasks), quar: quar}
	onDesktops(ctx, len(recs), opts.Desktops, opts.NewDesktop, opts.Logger, func(w *worker, i int) {
		rep.Attempts[i] = r.attempt(ctx, w, &recs[i])
	})
	rep.EndedAt = schema.Time{Time: time.Now()}
	rep.total()
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	r.quarantine(rep)
	return rep, nil
}

// replayRecords returns the records to replay, in file order, checking
// that each named one is in the run and graded, and that its task is
// given with the config it ran.
func replayRecords(runDir string, opts ReplayOptions) ([]schema.Record, error) {
	tasks := taskIndex(opts.Tasks)
	recs, err := pickRecords(runDir, opts.Rollouts, ErrReplay, opts.Logger, func(rec *schema.Record) (string, error) {
		if !rec.Status.Graded() || rec.Reward == nil {
			return fmt.Sprintf("is %s, not graded: only graded attempts replay", rec.Status), nil
		}
		t, ok := tasks[rec.TaskID]
		switch {
		case !ok:
			return "", fmt.Errorf("%w: rollout %s is of task %q, which the tasks given do not have: pass the batch's --tasks", ErrReplay, rec.RolloutID, rec.TaskID)
		case rec.TaskSHA != "" && rec.TaskSHA != TaskSHA(t):
			return "", fmt.Errorf("%w: task %q changed since rollout %s ran (its config's sha256 was %s, now %s): replay with the tasks file the batch ran", ErrReplay, rec.TaskID, rec.RolloutID, short(rec.TaskSHA), short(TaskSHA(t)))
		}
		return "", nil
	})
	if err == nil && len(recs) == 0 {
		err = fmt.Errorf("%w: %s has no graded attempt to replay", ErrReplay, runDir)
	}
	return recs, err
}

// pickRecords reads runDir's records and returns, in file order, every one
// skip passes ("" for a record to take; else why not, in words), or only
// those named by ids, each of which must be in the run and taken. skip's
// error stops the read; errors wrap sentinel. The records are read as
// export reads them (schema.ReadRunAttempts): a second final record of an
// attempt fails the read with a *schema.DuplicateFinalError, and a
// damaged line other than the last with an error wrapping
// schema.ErrDamagedRecords, rather than an attempt being taken twice or
// lost without a word. A torn last line, a crash mid-append, is logged.
func pickRecords(runDir string, ids []string, sentinel error, log *slog.Logger, skip func(*schema.Record) (string, error)) ([]schema.Record, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	found := map[string]bool{}
	var recs []schema.Record
	rs, err := schema.ReadRunAttempts(runDir, func(rec schema.Record) error {
		if len(want) > 0 && !want[rec.RolloutID] {
			return nil
		}
		found[rec.RolloutID] = true
		why, err := skip(&rec)
		switch {
		case err != nil:
			return err
		case why != "" && len(want) > 0:
			return fmt.Errorf("%w: rollout %s %s", sentinel, rec.RolloutID, why)
		case why == "":
			recs = append(recs, rec)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", runDir, err)
	}
	if rs.TornLines > 0 {
		log.Warn("skipped the torn last line of rollouts.jsonl (a crash mid-append; collect runs its attempt again)", "run", runDir, "line", rs.FirstTorn)
	}
	for _, id := range ids {
		if !found[id] {
			return nil, fmt.Errorf("%w: no rollout %q in %s (see its rollouts.jsonl)", sentinel, id, runDir)
		}
	}
	return recs, nil
}

func taskIndex(tasks []Task) map[string]Task {
	m := make(map[string]Task, len(tasks))
	for _, t := range tasks {
		m[t.ID] = t
	}
	return m
}

func short(sha string) string { return sha[:min(12, len(sha))] }

type replayer struct {
	opts  ReplayOptions
	store *schema.MessageStore
	tasks map[string]Task
	quar  *quarantine
}

// attempt replays rec on w's desktop.
func (r *replayer) attempt(ctx context.Context, w *worker, rec *schema.Record) (out AttemptReplay) {
	out = AttemptReplay{RolloutID: rec.RolloutID, TaskID: rec.TaskID, RecordedReward: rec.Reward,
		FirstDivergence: -1, RecordedS: rec.Timing.TotalS}
	d, err := w.desktop(ctx)
	if d == nil {
		out.Error = fmt.Sprintf("no desktop: %v", err)
		return out
	}
	// From the reset on, as the record's total_s: a desktop's creation
	// (a VM's boot) is no attempt's time.
	start := time.Now()
	defer func() { out.ReplayS = time.Since(start).Seconds() }()
	err = r.run(ctx, d, rec, &out)
	if err != nil {
		out.Error = err.Error()
		var de *desktopError
		if errors.As(err, &de) && de.failed {
			w.discard()
		}
	}
	return out
}

// run replays rec on d, filling out.
func (r *replayer) run(ctx context.Context, d desktop.Desktop, rec *schema.Record, out *AttemptReplay) error {
	task := r.tasks[rec.TaskID]
	ctx = desktop.WithAttempt(ctx, desktop.Attempt{GroupID: rec.GroupID, TaskID: rec.TaskID, Index: rec.Attempt, Try: rec.Try})
	if err := desk(ctx, "reset", d.Reset(ctx, task)); err != nil {
		return err
	}
	if want := recordedGolden(rec); want != "" {
		got := ""
		if rp, ok := d.(desktop.Reporter); ok {
			got = rp.AttemptReport().Golden
		}
		if got != want {
			return fmt.Errorf("the attempt started from golden state %s, and this desktop's start state is %q: its key changed (the image, the task's config or the backend's settings), so the start cannot be rebuilt; replay on the batch's image and settings", short(want), short(got))
		}
		out.Golden = want
	}
	if err := desk(ctx, "wait after reset", d.WaitAfterReset(ctx)); err != nil {
		return err
	}
	var obs *desktop.Observation
	for i := range rec.Steps {
		st := &rec.Steps[i]
		if obs == nil {
			o, err := d.Observe(ctx)
			if err != nil {
				return desk(ctx, "observe", err)
			}
			obs = &o
		}
		if err := r.compare(task, st, *obs, i, out); err != nil {
			return err
		}
		if r.opts.RecordedPace {
			if err := backoff.Sleep(ctx, time.Duration(st.Model.Seconds*float64(time.Second))); err != nil {
				return err
			}
		}
		obs = nil
		end, err := r.act(ctx, d, rec.TaskID, st, &obs)
		if err != nil {
			return err
		}
		if end {
			break
		}
	}
	if err := desk(ctx, "wait before eval", d.WaitBeforeEval(ctx)); err != nil {
		return err
	}
	reward, err := d.Evaluate(ctx, task)
	if err != nil {
		return desk(ctx, "evaluate", err)
	}
	out.ReplayedReward = &reward
	out.RewardAgrees = rec.Reward != nil && *rec.Reward == reward
	return nil
}

// act runs a step's recorded actions through the stepping the attempt
// ran them with (actionRun), each followed by the wait until the screen is
// ready, as the attempt did; it reports whether the attempt ended there.
func (r *replayer) act(ctx context.Context, d desktop.Desktop, taskID string, st *schema.Step, obs **desktop.Observation) (bool, error) {
	actions := make([]desktop.Action, len(st.Actions))
	for i, ar := range st.Actions {
		actions[i] = desktop.ParseAction(ar.Action)
	}
	// The replay's own action records and timing are not kept: the
	// report compares screens and rewards.
	var replayed schema.Step
	var tm schema.Timing
	run := actionRun{d: d, ready: r.opts.Ready, log: r.opts.Logger, taskID: taskID}
	return run.actions(ctx, actions, nil, &replayed, &tm, obs)
}

// compare matches the screen obs, as the harness puts it in a prompt,
// with the newest screenshot of step i's recorded prompt.
func (r *replayer) compare(task Task, st *schema.Step, obs desktop.Observation, i int, out *AttemptReplay) error {
	recorded, err := r.recordedShot(st)
	if err != nil {
		return fmt.Errorf("step %d: %w", i, err)
	}
	msgs, err := r.opts.Harness.NewEpisode(task).Prompt(obs)
	if err != nil {
		return &desktopError{err: fmt.Errorf("step %d: prompt from the replayed screen: %w", i, err), failed: true}
	}
	replayed, err := lastImage(msgs)
	if err != nil {
		return fmt.Errorf("step %d: the replayed prompt: %w", i, err)
	}
	sum := sha256.Sum256(replayed)
	m := ScreenMatch{Step: i, Recorded: recorded, Replayed: hex.EncodeToString(sum[:])}
	m.Identical = m.Recorded == m.Replayed
	if !m.Identical {
		old, err := r.store.ImagePNG(recorded)
		if err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		m.Distance = pixelDistance(old, replayed)
		if out.FirstDivergence < 0 {
			out.FirstDivergence = i
		}
	} else {
		out.ScreensIdentical++
	}
	out.Screens = append(out.Screens, m)
	return nil
}

// recordedShot returns the hash of the newest screenshot in a step's
// prompt: the screen the step acted on.
func (r *replayer) recordedShot(st *schema.Step) (string, error) {
	msgs, err := r.store.Messages(st.Request, schema.LoadOptions{KeepImageRefs: true})
	if err != nil {
		return "", err
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		parts := msgs[i].Content
		for j := len(parts) - 1; j >= 0; j-- {
			if u := parts[j].ImageURL; u != nil && strings.HasPrefix(u.URL, schema.ImageScheme) {
				return strings.TrimPrefix(u.URL, schema.ImageScheme), nil
			}
		}
	}
	return "", errors.New("the recorded prompt has no screenshot")
}

// lastImage returns the PNG of the last image data URL in msgs.
func lastImage(msgs []schema.Message) ([]byte, error) {
	for i := len(msgs) - 1; i >= 0; i-- {
		parts := msgs[i].Content
		for j := len(parts) - 1; j >= 0; j-- {
			if u := parts[j].ImageURL; u != nil {
				b64, ok := strings.CutPrefix(u.URL, "data:image/png;base64,")
				if !ok {
					return nil, fmt.Errorf("an image that is not a PNG data URL (%.40s…)", u.URL)
				}
				return base64.StdEncoding.DecodeString(b64)
			}
		}
	}
	return nil, errors.New("no screenshot")
}

// pixelDistance is the share of pixels that differ between two PNGs: 1
// when their sizes differ or one does not decode.
func pixelDistance(a, b []byte) float64 {
	ia, err := png.Decode(bytes.NewReader(a))
	if err != nil {
		return 1
	}
	ib, err := png.Decode(bytes.NewReader(b))
	if err != nil || ia.Bounds().Size() != ib.Bounds().Size() {
		return 1
	}
	ra, rb := ia.Bounds(), ib.Bounds()
	differ := 0
	for y := range ra.Dy() {
		for x := range ra.Dx() {
			if !samePixel(ia, ib, image.Pt(ra.Min.X+x, ra.Min.Y+y), image.Pt(rb.Min.X+x, rb.Min.Y+y)) {
				differ++
			}
		}
	}
	return float64(differ) / float64(ra.Dx()*ra.Dy())
}

func samePixel(a, b image.Image, pa, pb image.Point) bool {
	r1, g1, b1, a1 := a.At(pa.X, pa.Y).RGBA()
	r2, g2, b2, a2 := b.At(pb.X, pb.Y).RGBA()
	return r1 == r2 && g1 == g2 && b1 == b2 && a1 == a2
}

// recordedGolden is the golden key an attempt started from, "" if none.
func recordedGolden(rec *schema.Record) string {
	if rec.Env == nil {
		return ""
	}
	return rec.Env.Golden
}

// total sums the attempts into the report's totals.
func (rep *ReplayReport) total() {
	for _, a := range rep.Attempts {
		if a.ReplayedReward != nil {
			rep.Replayed++
			if a.RewardAgrees {
				rep.RewardsAgree++
			}
		}
		rep.Screens += len(a.Screens)
		rep.ScreensIdentical += a.ScreensIdentical
		rep.RecordedS += a.RecordedS
		rep.ReplayS += a.ReplayS
	}
}

// quarantine puts into quarantine the tasks whose replays reached their
// first screen and found it other than recorded: their start state is not
// what the batch's was.
func (r *replayer) quarantine(rep *ReplayReport) {
	for _, a := range rep.Attempts {
		if len(a.Screens) == 0 || a.Screens[0].Identical {
			continue
		}
		if r.quar.put(r.tasks[a.TaskID], schema.QuarantineReplayDiverges,
			fmt.Sprintf("a replay's first screen differs from the recorded one in %.1f%% of its pixels", 100*a.Screens[0].Distance), a.RolloutID) {
			rep.Quarantined = append(rep.Quarantined, a.TaskID)
		}
	}
}
