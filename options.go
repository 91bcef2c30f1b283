package rl

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"legato/rl/desktop"
	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// What every batch is given (PolicyConfig, CollectOptions, which
// ServeOptions embeds) and what it reports back (Progress,
// IncompleteError): the engine's vocabulary, shared by Collect and Serve.

// PolicyConfig says which model server and weights a batch uses.
type PolicyConfig = policy.Config

// Defaults of CollectOptions.
const (
	DefaultDesktops          = 1
	DefaultGroup             = 4
	DefaultMaxSteps          = 15
	DefaultEnvRetries        = 1
	DefaultErrorReruns       = 2
	DefaultServerDownTimeout = 5 * time.Minute
	DefaultImageMax          = qwen.DefaultImageMax
	DefaultProgressInterval  = 2 * time.Second
	DefaultSummaryInterval   = 10 * time.Second
)

// Bounds of CollectOptions, so that a typo cannot allocate gigabytes before
// the first attempt: GRPO groups are a handful to a few hundred attempts.
const (
	MaxDesktops   = 4096
	MaxGroup      = 1024
	MaxOversample = 8
	MaxMaxSteps   = 1000
	MaxImageMax   = 1000
	// MinRolloutTimeout is the shortest RolloutTimeout: a cap shorter than
	// one observation and model call truncates every attempt before its
	// first action, which is a typo, never a batch worth running.
	MinRolloutTimeout = time.Second
	// MaxAttempts bounds tasks × attempts per task.
	MaxAttempts = 1 << 20
)

// ErrInvalidOptions is wrapped by every error of CollectOptions.Validate
// and by Collect's errors about its arguments: nothing ran.
var ErrInvalidOptions = errors.New("invalid collect options")

// CollectOptions configures a batch. Zero values mean the documented
// defaults.
type CollectOptions struct {
	// Out is the run directory. Collecting into a directory that holds a
	// batch of the same tasks and policy continues it. Required.
	Out string
	// NewDesktop creates the desktop of a worker slot, at the start and
	// whenever a desktop failed and must be replaced. Required. Wrap it
	// with desktop.WithFixedWaits for fixed sleeps instead of the ready
	// signal (baselines).
	NewDesktop desktop.Factory
	// Desktops is the number of workers, each owning one desktop for the
	// whole batch (default 1, at most MaxDesktops).
	Desktops int
	// Group is G: the number of finished attempts that close a task's group
	// (default 4, at most MaxGroup).
	Group int
	// Oversample adds ceil(Oversample·G) attempts per task; the group closes
	// when G finish and the rest are cancelled or skipped (default 0, at
	// most MaxOversample).
	Oversample float64
	// MaxSteps bounds the model calls of one attempt (default 15).
	MaxSteps int
	// RolloutTimeout caps the stepping of one attempt, from its first
	// observation; an attempt that hits it stops stepping, is graded and
	// recorded as truncated. Time waiting for an absent model server does
	// not count. Zero means no cap; otherwise at least MinRolloutTimeout.
	RolloutTimeout time.Duration
	// EnvRetries is how many times an attempt whose desktop failed is
	// re-queued (default 1; negative for none).
	EnvRetries int
	// ErrorReruns is how many times collecting into the directory again
	// reruns an attempt whose record is an error (default 2; negative for
	// never). The batch's first run records it in batch.json, which later
	// runs follow, except that a negative value always means never
	// (--no-retry-errors).
	ErrorReruns int
	// ServerDownTimeout bounds how long the batch waits for a model server
	// that stopped answering (default 5 min). Until then every desktop
	// pauses at its next model call and the calls are sent again once the
	// server answers; after it, Collect stops and returns ErrServerDown.
	ServerDownTimeout time.Duration
	// Harness turns observations into prompts and replies into actions
	// (default: the Qwen computer-use harness keeping ImageMax screenshots).
	Harness policy.Harness
	// ImageMax is the number of screenshots the default harness keeps in
	// the prompt (default 20).
	ImageMax int
	// Ready configures the wait after each action: the backend's own
	// signal, or the generic one.
	Ready desktop.ReadyOptions
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

	// GradeTwice is the fraction of graded attempts whose end state is
	// graded a second time (desktop.Regrader: the evaluator's getters and
	// metric again, without its postconfig), 0 to 1 (default 0: none).
	// A second reward that differs is recorded (Record.SecondGrade),
	// counted per task in the summary, and quarantines the task.
	GradeTwice float64
	// Quarantine is a task quarantine file shared across batches (one a
	// batch creates when missing). The batch skips the tasks it or the
	// run directory's quarantine.json holds (with the config they were
	// quarantined with), and puts into both the tasks it finds unfit: a
	// grader that disagrees with itself, a reward out of range, a reset
	// that failed on QuarantineSetupFails desktops.
	Quarantine string
	// QuarantineSetupFails is how many desktops a task's reset must fail
	// on to quarantine it (default DefaultQuarantineSetupFails).
	QuarantineSetupFails int
	// KeepEndStates keeps every attempt's end state, as it is before its
	// grade, on desktops that can (desktop.EndStateKeeper), so Regrade can
	// grade it again later; the record names it (Record.EndState).
	KeepEndStates bool
	// EndStateBytes bounds the space of the batch's kept end states: past
	// it the oldest are dropped (default DefaultEndStateBytes).
	EndStateBytes int64
	// Environment describes the desktops NewDesktop makes: their backend
	// and each knob of it that changes screens or rewards (the CLI's
	// --backend, --fake-success, --image, --grader...). batch.json
	// records it, and continuing the batch with another is refused,
	// naming the knob: a group would mix the rewards of two
	// environments. Nil records none and checks none.
	Environment *schema.Environment
	// AdvantageStd is the std that divides a group's advantages
	// (Group.Advantages, a service's results; export follows the batch):
	// schema.PopulationStd, or schema.SampleStd as slime and SkyRL
	// compute theirs. batch.json (a service's journal) records it, and a
	// batch keeps the one its first run recorded: "" takes it
	// (PopulationStd for a new batch, or one recorded before the setting
	// was), and another is refused, naming it.
	AdvantageStd schema.AdvantageStd

	// OnCommitted, when set, is told how long each finished try's record
	// took from its hand-over to being durable: how long the try's
	// attempt stays unrecorded (legato rl bench prints its distribution).
	// It is called from the committing goroutines, concurrently.
	OnCommitted func(time.Duration)
}

// DefaultEndStateBytes is the default bound on a batch's kept end states.
const DefaultEndStateBytes = 100 << 30

func (o CollectOptions) withDefaults() CollectOptions {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Desktops, DefaultDesktops)
	def(&o.Group, DefaultGroup)
	def(&o.MaxSteps, DefaultMaxSteps)
	def(&o.ImageMax, DefaultImageMax)
	def(&o.QuarantineSetupFails, DefaultQuarantineSetupFails)
	if o.EndStateBytes == 0 {
		o.EndStateBytes = DefaultEndStateBytes
	}
	def(&o.EnvRetries, DefaultEnvRetries)
	o.EnvRetries = max(o.EnvRetries, 0)
	def(&o.ErrorReruns, DefaultErrorReruns)
	if o.ServerDownTimeout == 0 {
		o.ServerDownTimeout = DefaultServerDownTimeout
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if o.SummaryInterval == 0 {
		o.SummaryInterval = DefaultSummaryInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Ready = o.Ready.WithDefaults()
	return o
}

// Validate reports every option that cannot run a batch, each naming the
// option and what it accepts; the errors wrap ErrInvalidOptions.
func (o CollectOptions) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if o.Out == "" {
		bad("no run directory: set CollectOptions.Out (--out DIR)")
	}
	if o.NewDesktop == nil {
		bad("no desktops: set CollectOptions.NewDesktop")
	}
	between := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			bad("%s %d: want %d to %d", name, v, lo, hi)
		}
	}
	between("Desktops (--desktops)", o.Desktops, 0, MaxDesktops)
	between("Group (--group)", o.Group, 0, MaxGroup)
	between("MaxSteps (--max-steps)", o.MaxSteps, 0, MaxMaxSteps)
	between("ImageMax (--image-max)", o.ImageMax, 0, MaxImageMax)
	if !(o.GradeTwice >= 0 && o.GradeTwice <= 1) {
		bad("GradeTwice (--grade-twice) %v: want a fraction from 0 to 1", o.GradeTwice)
	}
	if o.EndStateBytes < 0 {
		bad("EndStateBytes (--end-states-max) %d: want > 0 (0 means the default)", o.EndStateBytes)
	}
	if o.QuarantineSetupFails < 0 {
		bad("QuarantineSetupFails (--quarantine-setup-fails) %d: want ≥ 1 (0 means the default)", o.QuarantineSetupFails)
	}
	if o.Oversample < 0 || o.Oversample > MaxOversample || math.IsNaN(o.Oversample) {
		bad("Oversample (--oversample) %v: want 0 to %d", o.Oversample, MaxOversample)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"RolloutTimeout (--rollout-timeout)", o.RolloutTimeout}, {"ServerDownTimeout (--server-down-timeout)", o.ServerDownTimeout},
		{"ProgressInterval", o.ProgressInterval}, {"SummaryInterval", o.SummaryInterval},
	} {
		if d.v < 0 {
			bad("%s %v: want ≥ 0 (0 means the default)", d.name, d.v)
		}
	}
	if o.RolloutTimeout > 0 && o.RolloutTimeout < MinRolloutTimeout {
		bad("RolloutTimeout (--rollout-timeout) %v: want 0 (no cap) or at least %v", o.RolloutTimeout, MinRolloutTimeout)
	}
	if o.AdvantageStd != "" {
		if _, err := schema.ParseAdvantageStd(string(o.AdvantageStd)); err != nil {
			bad("AdvantageStd (--advantage-std) %q: want %s or %s", o.AdvantageStd, schema.PopulationStd, schema.SampleStd)
		}
	}
	if err := o.Ready.Validate(); err != nil {
		bad("Ready: %v", err)
	}
	return errors.Join(errs...)
}

// AttemptsPerTask is G + ceil(oversample·G).
func AttemptsPerTask(group int, oversample float64) int {
	// Rounding guards against 0.25·8 landing a hair above 2.
	extra := math.Ceil(math.Round(oversample*float64(group)*1e9) / 1e9)
	return group + int(extra)
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

// IncompleteError is Collect's error when groups ended short of G finished
// attempts; it wraps ErrBatchIncomplete.
type IncompleteError struct {
	// Short groups of Groups did not reach Group finished attempts.
	Short, Groups, Group int
	// Rerunnable counts the error records that collecting into the
	// directory again reruns; the others have used up the batch's
	// ErrorReruns.
	Rerunnable int
}

func (e *IncompleteError) Error() string {
	next := fmt.Sprintf("collecting again reruns %d of them", e.Rerunnable)
	if e.Rerunnable == 0 {
		next = "their reruns are used up, so collecting again reruns none of them"
	}
	return fmt.Sprintf("%v: %d of %d groups did not reach %d finished attempts (see the error records; %s)",
		ErrBatchIncomplete, e.Short, e.Groups, e.Group, next)
}

func (e *IncompleteError) Unwrap() error { return ErrBatchIncomplete }
