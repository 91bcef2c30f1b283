package rl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"legato/rl/desktop"
	"legato/rl/export"
	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// PolicyConfig says which model server and weights a batch uses.
type PolicyConfig = policy.Config

// Defaults of CollectOptions.
const (
	DefaultDesktops         = 1
	DefaultGroup            = 4
	DefaultMaxSteps         = 15
	DefaultEnvRetries       = 1
	DefaultImageMax         = 20
	DefaultProgressInterval = 2 * time.Second
	DefaultSummaryInterval  = 10 * time.Second
)

// CollectOptions configures a batch. Zero values mean the documented
// defaults.
type CollectOptions struct {
	// Out is the run directory. Collecting into a directory that holds a
	// batch of the same tasks and policy continues it. Required.
	Out string
	// NewDesktop creates the desktop of a worker slot, at the start and
	// whenever a desktop failed and must be replaced. Required.
	NewDesktop desktop.Factory
	// Desktops is the number of workers, each owning one desktop for the
	// whole batch (default 1).
	Desktops int
	// Group is G: the number of finished attempts that close a task's group
	// (default 4).
	Group int
	// Oversample adds ceil(Oversample·G) attempts per task; the group closes
	// when G finish and the rest are cancelled or skipped (default 0).
	Oversample float64
	// MaxSteps bounds the model calls of one attempt (default 15).
	MaxSteps int
	// RolloutTimeout caps the stepping of one attempt, from its first
	// observation; an attempt that hits it stops stepping, is graded and
	// recorded as truncated. Zero means no cap.
	RolloutTimeout time.Duration
	// EnvRetries is how many times an attempt whose desktop failed is
	// re-queued (default 1; negative for none).
	EnvRetries int
	// Harness turns observations into prompts and replies into actions
	// (default: the Qwen computer-use harness keeping ImageMax screenshots).
	Harness policy.Harness
	// ImageMax is the number of screenshots the default harness keeps in
	// the prompt (default 20).
	ImageMax int
	// Ready configures the wait after each action.
	Ready ReadyOptions
	// OnGroup, if set, is called once for every group when it ends, in the
	// order groups end, from one goroutine of the batch. Collect returns
	// only after the last call returned. A slow OnGroup delays no desktop.
	OnGroup func(Group)
	// Progress, if set, is called every ProgressInterval (default 2 s) and
	// once at the end.
	Progress         func(Progress)
	ProgressInterval time.Duration
	// SummaryInterval is how often summary.json is refreshed during the
	// batch (default 10 s).
	SummaryInterval time.Duration
	// Logger receives the batch's log (default: discard).
	Logger *slog.Logger
}

func (o CollectOptions) withDefaults() CollectOptions {
	if o.Desktops <= 0 {
		o.Desktops = DefaultDesktops
	}
	if o.Group <= 0 {
		o.Group = DefaultGroup
	}
	if o.MaxSteps <= 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	switch {
	case o.EnvRetries == 0:
		o.EnvRetries = DefaultEnvRetries
	case o.EnvRetries < 0:
		o.EnvRetries = 0
	}
	if o.ImageMax <= 0 {
		o.ImageMax = DefaultImageMax
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if o.SummaryInterval <= 0 {
		o.SummaryInterval = DefaultSummaryInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Ready = o.Ready.withDefaults()
	return o
}

// Validate reports whether the options can run a batch.
func (o CollectOptions) Validate() error {
	var errs []error
	if o.Out == "" {
		errs = append(errs, errors.New("no run directory: set CollectOptions.Out (--out DIR)"))
	}
	if o.NewDesktop == nil {
		errs = append(errs, errors.New("no desktops: set CollectOptions.NewDesktop"))
	}
	if o.Oversample < 0 || math.IsNaN(o.Oversample) || math.IsInf(o.Oversample, 0) {
		errs = append(errs, fmt.Errorf("oversample %v: want a number ≥ 0", o.Oversample))
	}
	if o.RolloutTimeout < 0 {
		errs = append(errs, fmt.Errorf("rollout timeout %v: want ≥ 0", o.RolloutTimeout))
	}
	if err := o.Ready.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AttemptsPerTask is G + ceil(oversample·G).
func AttemptsPerTask(group int, oversample float64) int {
	// Rounding guards against 0.25·8 landing a hair above 2.
	extra := math.Ceil(math.Round(oversample*float64(group)*1e9) / 1e9)
	return group + int(extra)
}

// Group is a task's group of attempts when it ends, for a trainer that
// consumes a batch while it runs.
type Group struct {
	ID     string
	TaskID string
	// Closed is true when G attempts finished; false when the group ended
	// short because attempts failed for good.
	Closed bool
	// Finished are the records of the finished (ok, truncated) attempts
	// that count for the group, at most G.
	Finished []Record
	// Advantages[i] is the GRPO advantage of Finished[i]: (reward − mean) /
	// population std over Finished, 0 when all rewards are equal.
	Advantages []float64
}

// Progress is a snapshot of a running batch.
type Progress struct {
	Elapsed      time.Duration
	GroupsTotal  int
	GroupsEnded  int
	GroupsClosed int
	Counts       map[Status]int
	// Running counts attempts on desktops now; InFlight model calls now.
	Running  int
	InFlight int
	// RolloutsPerHour counts graded attempts (ok, truncated, surplus).
	RolloutsPerHour float64
	// ETA estimates the time left from the rate groups end at; zero when
	// unknown.
	ETA time.Duration
	// Final is set on the last call.
	Final bool
}

// ErrBatchIncomplete is returned (wrapped) when a batch ended with groups
// that could not reach G finished attempts.
var ErrBatchIncomplete = errors.New("batch incomplete")

// Collect runs a batch: every task's group of attempts, on opts.Desktops
// desktops, against the model server of pol, written to opts.Out.
//
// Cancelling ctx stops new attempts, cancels running ones, closes every
// desktop, writes the summary and returns it with ctx's error. Attempts
// that were interrupted leave no record (one already graded is kept);
// collecting into the same directory again runs them. The batch also stops,
// the same way, when the run directory cannot be written or the model
// server refuses the key or the model (401, 403, 404): Collect then returns
// that error. Otherwise the returned error is nil when every group closed,
// and wraps ErrBatchIncomplete when some could not (the records say why).
func Collect(ctx context.Context, tasks []Task, pol PolicyConfig, opts CollectOptions) (*Summary, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	if len(tasks) == 0 {
		return nil, errors.New("collect: no tasks")
	}
	if err := checkTaskIDs(tasks); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	if pol.Logger == nil {
		pol.Logger = opts.Logger
	}
	client, err := policy.New(pol)
	if err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer client.Close()
	harness := opts.Harness
	if harness == nil {
		harness = qwen.New(qwen.Config{ImageMax: opts.ImageMax})
	}
	if o := opts.Ready; o.Disabled {
		opts.NewDesktop = desktop.WithFixedWaits(opts.NewDesktop, desktop.FixedWaits{
			AfterReset: o.AfterReset, AfterAction: o.FixedWait, BeforeEval: o.BeforeEval})
	}
	m := manifestFor(tasks, pol, opts)
	if err := checkManifest(opts.Out, m); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	run, err := schema.Create(opts.Out)
	if err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer run.Close()
	if n := run.DroppedTail(); n > 0 {
		opts.Logger.Warn("cut a torn last line off rollouts.jsonl (a crash mid-write); its attempt runs again", "bytes", n)
	}
	b := newBatch(tasks, pol, opts, client, harness, run)
	if err := b.resume(); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	if err := writeManifest(opts.Out, m); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	return b.run(ctx)
}

func checkTaskIDs(tasks []Task) error {
	seen := make(map[string]int, len(tasks))
	for i, t := range tasks {
		if t.ID == "" {
			return fmt.Errorf("task %d has no id", i)
		}
		if j, ok := seen[t.ID]; ok {
			return fmt.Errorf("tasks %d and %d have the same id %q", j, i, t.ID)
		}
		seen[t.ID] = i
	}
	return nil
}

// groupAdvantages wraps export.Advantages for the records of a group.
func groupAdvantages(recs []Record) []float64 {
	rewards := make([]float64, len(recs))
	for i, r := range recs {
		if r.Reward != nil {
			rewards[i] = *r.Reward
		}
	}
	return export.Advantages(rewards)
}
