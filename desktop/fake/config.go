package fake

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Default screen size, the size of OSWorld's VMs.
const (
	DefaultWidth  = 1920
	DefaultHeight = 1080
)

// Screen sizes outside [minSide, maxSide] are refused: smaller ones leave no
// room for the screen's regions, larger ones only waste memory.
const (
	minSide = 32
	maxSide = 8192
)

// Config describes a fake desktop. The zero value is a valid config: a
// 1920×1080 desktop with seed 0, no latency, no faults, that rewards every
// attempt with 0.
//
// A Config is read by New and NewFleet; the maps and slices in it must not be
// modified afterwards.
type Config struct {
	// Name names the desktop in errors (desktop.Error.Desktop); "fake" when
	// empty. A Fleet appends the slot to it.
	Name string
	// Seed makes every random draw (latencies, rewards, faults with a
	// probability) reproducible. The draws of an attempt's calls are keyed
	// by Seed and the attempt, whatever desktop runs it (see the package
	// documentation). Zero is a seed like any other.
	Seed uint64
	// Width and Height are the screen size in pixels; zero means
	// DefaultWidth and DefaultHeight.
	Width, Height int
	// Latency is how long each phase takes. The zero value takes no time.
	Latency Latencies
	// Rewards says how each task, by ID, is graded; tasks not in it are
	// graded by DefaultReward. Infeasible tasks ignore both (see Evaluate).
	Rewards map[string]Reward
	// DefaultReward grades tasks not in Rewards. The zero value always
	// rewards 0.
	DefaultReward Reward
	// Faults are injected in order: on each call the first fault that fires
	// wins.
	Faults []Fault
	// EndStates is the directory where the desktops keep end states
	// (desktop.EndStateKeeper), one file each, named by its content; ""
	// keeps none. Any fake desktop given the same directory grades them
	// again (desktop.EndStateGrader).
	EndStates string
	// ReadyWaiter makes the desktops returned by AsConfigured and by a Fleet
	// implement desktop.ReadyWaiter, so that the scheduler uses the
	// backend's own ready signal instead of comparing screenshots.
	ReadyWaiter bool
	// Stepper makes them implement desktop.Stepper too (with ReadyWaiter):
	// a Step is Act, then WaitReady, reported as one call whose screenshot
	// was captured where the desktop runs (Ready.Capture is the Observe
	// time).
	Stepper bool
}

// Latencies holds one Latency per phase. A phase whose Latency is zero takes
// no time.
type Latencies struct {
	// Create is the time a Fleet takes to create a desktop (boot a VM).
	Create Latency
	// Reset, WaitAfterReset, Observe, Act, WaitBeforeEval and Evaluate are
	// the times the methods of the same name take.
	Reset          Latency
	WaitAfterReset Latency
	Observe        Latency
	Act            Latency
	WaitBeforeEval Latency
	Evaluate       Latency
	// Settle is how long the screen keeps changing after a Reset and after
	// each Code action. Observe returns a different frame on every call until
	// it has passed; WaitAfterReset, WaitBeforeEval and WaitReady wait for
	// it to pass.
	Settle Latency
}

// Latency is a distribution of durations: the sum of the components that
// are set, capped at Cap. The zero value is always 0.
//
//   - Fixed is always added.
//   - Uniform: when Max > 0, a uniform draw from [Min, Max) is added.
//   - Log-normal: when Median > 0, Median·exp(Sigma·Z) is added, Z standard
//     normal; that is a log-normal with mu = ln(Median) and sigma = Sigma.
//   - Pareto: when Alpha > 0, a Pareto draw with scale Scale (its minimum,
//     xm) and shape Alpha is added. Alpha ≤ 2 has infinite variance, Alpha
//     ≤ 1 an infinite mean: the heavy tail of a VM that sometimes stalls.
//
// For example Latency{Fixed: 2 * time.Second, Alpha: 1.5, Scale: 100 *
// time.Millisecond, Cap: time.Minute} is two seconds plus a heavy tail.
type Latency struct {
	Fixed    time.Duration
	Min, Max time.Duration
	Median   time.Duration
	Sigma    float64
	Scale    time.Duration
	Alpha    float64
	// Cap, when > 0, bounds the sum.
	Cap time.Duration
}

// maxLatency keeps float-to-Duration conversions of heavy tails from
// overflowing.
const maxLatency = time.Duration(1 << 62)

// Sample draws one duration from l using r.
func (l Latency) Sample(r *rand.Rand) time.Duration {
	d := float64(l.Fixed)
	if l.Max > 0 {
		d += float64(l.Min) + r.Float64()*float64(l.Max-l.Min)
	}
	if l.Median > 0 {
		d += float64(l.Median) * math.Exp(l.Sigma*r.NormFloat64())
	}
	if l.Alpha > 0 {
		// 1-Float64 lies in (0, 1], so the power is finite.
		d += float64(l.Scale) * math.Pow(1-r.Float64(), -1/l.Alpha)
	}
	if l.Cap > 0 && d > float64(l.Cap) {
		d = float64(l.Cap)
	}
	if d >= float64(maxLatency) {
		return maxLatency
	}
	return time.Duration(d)
}

// Validate reports whether l describes a distribution, and which field is
// wrong if not.
func (l Latency) Validate() error {
	switch {
	case l.Fixed < 0, l.Min < 0, l.Max < 0, l.Median < 0, l.Scale < 0, l.Cap < 0:
		return errors.New("durations must not be negative")
	case l.Min > 0 && l.Max == 0:
		return errors.New("Min is set without Max: set Max for a uniform draw from [Min, Max)")
	case l.Max > 0 && l.Max < l.Min:
		return fmt.Errorf("Max %v is below Min %v", l.Max, l.Min)
	case !(l.Sigma >= 0) || math.IsInf(l.Sigma, 0):
		return fmt.Errorf("Sigma %v must be a finite number ≥ 0", l.Sigma)
	case l.Sigma > 0 && l.Median == 0:
		return errors.New("Sigma is set without Median: set Median (e^mu) for a log-normal draw")
	case !(l.Alpha >= 0) || math.IsInf(l.Alpha, 0):
		return fmt.Errorf("Alpha %v must be a finite number ≥ 0", l.Alpha)
	case (l.Alpha > 0) != (l.Scale > 0):
		return errors.New("a Pareto draw needs both Alpha and Scale")
	}
	return nil
}

func (ls Latencies) validate() error {
	for _, p := range []struct {
		name string
		l    Latency
	}{
		{"Create", ls.Create}, {"Reset", ls.Reset}, {"WaitAfterReset", ls.WaitAfterReset},
		{"Observe", ls.Observe}, {"Act", ls.Act}, {"WaitBeforeEval", ls.WaitBeforeEval},
		{"Evaluate", ls.Evaluate}, {"Settle", ls.Settle},
	} {
		if err := p.l.Validate(); err != nil {
			return fmt.Errorf("Latency.%s: %w", p.name, err)
		}
	}
	return nil
}

// Reward says how the fake grades a feasible task: an attempt succeeds with
// probability P and then scores Value (1 when Value is 0); otherwise it
// scores 0. Whether an attempt succeeds is drawn once per attempt from
// Config.Seed and the attempt (group, task, index, try) that Evaluate's ctx
// carries (desktop.WithAttempt), so the same seed grades the same attempts
// the same on any desktop, with any number of desktops, across a resume.
// Without an attempt in the ctx it is drawn from the desktop's seed, the
// task ID and how many times the desktop was reset to that task.
//
// So Reward{} always gives 0, Reward{P: 1} always 1, Reward{P: 0.3} gives 1 on
// about 30% of attempts, and Reward{P: 1, Value: 0.5} always 0.5.
//
// An attempt that took no action since its Reset scores AtStart instead,
// 0 unless set: an untouched start state does not solve a task, unless the
// image already does (AtStart 1, or 0.5 for partial credit), which legato
// rl tasks check is there to find.
//
// Flaky makes the grader disagree with itself: EvaluateAgain draws anew
// (from the same seed and attempt, so still reproducibly) where it would
// otherwise repeat Evaluate's reward; on an untouched start state it draws
// as for an attempt.
type Reward struct {
	P       float64
	Value   float64
	AtStart float64
	Flaky   bool
}

func (r Reward) validate() error {
	if !(r.P >= 0 && r.P <= 1) {
		return fmt.Errorf("P %v must lie in [0, 1]", r.P)
	}
	if !(r.Value >= 0 && r.Value <= 1) {
		return fmt.Errorf("Value %v must lie in [0, 1]", r.Value)
	}
	if !(r.AtStart >= 0 && r.AtStart <= 1) {
		return fmt.Errorf("AtStart %v must lie in [0, 1]", r.AtStart)
	}
	return nil
}

// Phase names a call a fault can be injected into. Its value is the op of
// the desktop.Error the call returns.
type Phase string

// Phases.
const (
	// PhaseCreate is a Fleet creating a desktop; its calls are counted per
	// Fleet.
	PhaseCreate         Phase = "create"
	PhaseReset          Phase = "reset"
	PhaseWaitAfterReset Phase = "wait after reset"
	PhaseObserve        Phase = "observe"
	PhaseAct            Phase = "act"
	PhaseWaitBeforeEval Phase = "wait before eval"
	PhaseEvaluate       Phase = "evaluate"
	PhaseWaitReady      Phase = "wait ready"
)

// index gives the position of a desktop call's phase in Desktop.calls, or
// -1 for PhaseCreate and unknown phases.
func (p Phase) index() int {
	switch p {
	case PhaseReset:
		return 0
	case PhaseWaitAfterReset:
		return 1
	case PhaseObserve:
		return 2
	case PhaseAct:
		return 3
	case PhaseWaitBeforeEval:
		return 4
	case PhaseEvaluate:
		return 5
	case PhaseWaitReady:
		return 6
	}
	return -1
}

// nPhases is the number of phases index numbers.
const nPhases = 7

// FaultKind is what an injected fault does.
type FaultKind int

const (
	// FaultError makes the call fail with a desktop failure wrapping
	// ErrInjected; the desktop keeps working afterwards.
	FaultError FaultKind = iota + 1
	// FaultHang makes the call block until its ctx is done or the desktop
	// is closed.
	FaultHang
	// FaultCrash makes the call and every later one (but Close) fail with
	// an error wrapping ErrCrashed: the VM died. On PhaseCreate it is a
	// FaultError.
	FaultCrash
	// FaultUnsupported makes the call fail with an error wrapping
	// desktop.ErrUnsupported: the task cannot run on this backend.
	FaultUnsupported
)

func (k FaultKind) String() string {
	switch k {
	case FaultError:
		return "error"
	case FaultHang:
		return "hang"
	case FaultCrash:
		return "crash"
	case FaultUnsupported:
		return "unsupported"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Fault is a scheduled failure. It fires on a call of Phase when the call
// is the OnCall-th of that phase on the desktop (counting from 1, every call
// counted, failed ones too), or with probability Prob on any call; both may
// be set. The probability is drawn like every draw (see the package
// documentation): for an attempt's call from Config.Seed, the attempt and
// the call's number of its phase in the attempt, so the same seed fails the
// same calls of the same attempts whatever desktop runs them, and a retry
// (the next try) draws anew.
type Fault struct {
	Phase Phase
	Kind  FaultKind
	// OnCall, when > 0, fires on that call.
	OnCall int
	// Prob, when > 0, fires on each call with this probability.
	Prob float64
	// Desktop, when set, restricts the fault to the desktop of that name
	// (a Fleet names them "fake-0", "fake-1", ...; replacements "fake-0.1",
	// "fake-0.2", ...). Use it to fail one desktop but not its replacement.
	Desktop string
	// Task, when set, restricts the fault to calls made for that task ID
	// (the task of Reset and Evaluate, the last task reset to otherwise).
	Task string
}

func (f Fault) validate() error {
	switch {
	case f.Phase != PhaseCreate && f.Phase.index() < 0:
		return fmt.Errorf("unknown Phase %q", f.Phase)
	case f.Kind < FaultError || f.Kind > FaultUnsupported:
		return fmt.Errorf("unknown Kind %v", f.Kind)
	case f.OnCall < 0:
		return fmt.Errorf("OnCall %d must be ≥ 0", f.OnCall)
	case !(f.Prob >= 0 && f.Prob <= 1):
		return fmt.Errorf("Prob %v must lie in [0, 1]", f.Prob)
	case f.OnCall == 0 && f.Prob == 0:
		return errors.New("never fires: set OnCall or Prob")
	case f.Phase == PhaseCreate && f.Task != "":
		return errors.New("Task has no meaning for PhaseCreate")
	}
	return nil
}

// Validate reports whether c is usable, naming the field that is not.
func (c Config) Validate() error {
	if err := validateSide("Width", c.Width); err != nil {
		return err
	}
	if err := validateSide("Height", c.Height); err != nil {
		return err
	}
	if err := c.Latency.validate(); err != nil {
		return err
	}
	for id, r := range c.Rewards {
		if err := r.validate(); err != nil {
			return fmt.Errorf("Rewards[%q]: %w", id, err)
		}
	}
	if err := c.DefaultReward.validate(); err != nil {
		return fmt.Errorf("DefaultReward: %w", err)
	}
	for i, f := range c.Faults {
		if err := f.validate(); err != nil {
			return fmt.Errorf("Faults[%d]: %w", i, err)
		}
	}
	return nil
}

func validateSide(name string, v int) error {
	if v != 0 && (v < minSide || v > maxSide) {
		return fmt.Errorf("%s %d must be 0 (default) or lie in [%d, %d]", name, v, minSide, maxSide)
	}
	return nil
}

// size returns the screen size with defaults applied.
func (c Config) size() (w, h int) {
	w, h = c.Width, c.Height
	if w == 0 {
		w = DefaultWidth
	}
	if h == 0 {
		h = DefaultHeight
	}
	return w, h
}
