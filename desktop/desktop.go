// Package desktop defines the contract between legato's scheduler and the
// machines that run computer-use tasks.
//
// A Desktop is one machine (a libvirt VM, a remote OSWorld guest, an
// in-memory fake) owned by one worker for the whole batch. The worker drives
// it through one attempt at a time:
//
//	Reset → WaitAfterReset → [Observe → (model) → Act]* → WaitBeforeEval → Evaluate
//
// and calls Close when the batch ends or the desktop has failed.
//
// # Contract
//
// Methods of one Desktop are never called concurrently; Close may be called
// at any time from another goroutine and makes any running call return
// promptly. Every blocking method takes a ctx and returns soon after it is
// done, with an error that wraps ctx.Err().
//
// Errors are classified at the boundary:
//   - an error returned after the caller's ctx is done means the caller gave
//     up; it says nothing about the desktop (a backend's own internal
//     timeouts, by contrast, are failures);
//   - an error wrapping ErrUnsupported means the task cannot run on this
//     backend at all (a setup step it refuses, a metric it lacks); retrying on
//     another desktop of the same kind would fail the same way;
//   - any other error means the desktop failed (VM died, guest server gone,
//     setup step failed): the caller closes this desktop, creates a new one,
//     and may retry the attempt there.
//
// An action that the guest runs but that fails inside the guest (a pyautogui
// call raising) is not a desktop failure: Act reports it in ActResult.
//
// Close is idempotent and releases everything the desktop holds (processes,
// VMs, disk images, ports); after Close every method returns ErrClosed.
package desktop

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Desktop is one machine that runs tasks. See the package documentation for
// the contract every implementation keeps.
type Desktop interface {
	// Reset brings the desktop to the task's initial state: a clean
	// baseline, then the task's setup steps.
	Reset(ctx context.Context, task Task) error
	// WaitAfterReset returns once the desktop is ready for its first
	// observation (the screen has settled), or the backend's bound passed.
	WaitAfterReset(ctx context.Context) error
	// Observe takes a screenshot.
	Observe(ctx context.Context) (Observation, error)
	// Act runs one action.
	Act(ctx context.Context, action Action) (ActResult, error)
	// WaitBeforeEval returns once the desktop is ready to be graded.
	WaitBeforeEval(ctx context.Context) error
	// Evaluate grades the attempt with the task's evaluator and returns a
	// reward in [0, 1]. It sees the actions taken since the last Reset (the
	// evaluator of an infeasible task asks whether the last one was FAIL).
	Evaluate(ctx context.Context, task Task) (float64, error)
	// Close releases the desktop. It is idempotent.
	Close() error
}

// Factory creates the desktop for a worker slot. The scheduler calls it once
// per slot at the start of a batch and again each time it replaces a desktop
// that failed.
type Factory func(ctx context.Context, slot int) (Desktop, error)

// Task is one OSWorld task: an instruction, the setup that prepares the
// desktop, and the evaluator that grades the outcome.
type Task struct {
	// ID is unique within a batch.
	ID string `json:"id"`
	// Domain is OSWorld's domain (chrome, os, multi_apps, ...); it chooses
	// the kind of reset.
	Domain string `json:"domain"`
	// Instruction is what the agent is asked to do.
	Instruction string `json:"instruction"`
	// Snapshot names the machine snapshot the task starts from.
	Snapshot string `json:"snapshot,omitempty"`
	// Setup is the task's "config": setup steps run on Reset.
	Setup []SetupStep `json:"config,omitempty"`
	// Evaluator is the task's evaluator, kept as written; graders parse it.
	Evaluator json.RawMessage `json:"evaluator"`
	// RelatedApps lists the applications the task uses.
	RelatedApps []string `json:"related_apps,omitempty"`
	// Raw is the whole task config as it was read.
	Raw json.RawMessage `json:"-"`
}

// SetupStep is one entry of an OSWorld task's "config" (or of its
// evaluator's "postconfig").
type SetupStep struct {
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Observation is what the agent sees.
type Observation struct {
	// Screenshot is a PNG of the whole screen.
	Screenshot []byte
	// Width and Height are the screen size in pixels; the PNG has this
	// size.
	Width, Height int
	// At is when the screenshot was taken.
	At time.Time
}

// ActionKind says what an Action does.
type ActionKind int

const (
	// Code runs Action.Code, a pyautogui program, in the guest.
	Code ActionKind = iota
	// Wait does nothing; the agent waits for the screen to change.
	Wait
	// Done says the agent believes the task is complete.
	Done
	// Fail says the agent believes the task cannot be done.
	Fail
)

// Special action strings, as OSWorld writes them.
const (
	WaitCode = "WAIT"
	DoneCode = "DONE"
	FailCode = "FAIL"
)

// Action is one thing the agent asks the desktop to do.
type Action struct {
	Kind ActionKind
	// Code is the pyautogui program for Kind == Code.
	Code string
}

// Special actions.
var (
	WaitAction = Action{Kind: Wait}
	DoneAction = Action{Kind: Done}
	FailAction = Action{Kind: Fail}
)

// String returns the action exactly as it is recorded and sent: the
// pyautogui code, or WAIT, DONE, FAIL.
func (a Action) String() string {
	switch a.Kind {
	case Wait:
		return WaitCode
	case Done:
		return DoneCode
	case Fail:
		return FailCode
	}
	return a.Code
}

// ParseAction is the inverse of Action.String.
func ParseAction(s string) Action {
	switch s {
	case WaitCode:
		return WaitAction
	case DoneCode:
		return DoneAction
	case FailCode:
		return FailAction
	}
	return Action{Kind: Code, Code: s}
}

// Terminal reports whether the action ends the attempt (DONE or FAIL).
func (a Action) Terminal() bool { return a.Kind == Done || a.Kind == Fail }

// ActResult is what running an action produced in the guest.
type ActResult struct {
	// ExitCode is the exit status of the action's program; non-zero means
	// the action failed inside the guest, not that the desktop failed.
	ExitCode int
	// Output and Error are the program's standard output and error.
	Output string
	Error  string
}

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("desktop closed")
	// ErrUnsupported means the task cannot run on this backend; it is not a
	// desktop failure and is not retried.
	ErrUnsupported = errors.New("unsupported by this desktop")
)

// Error is a desktop failure with the operation and the desktop it happened
// on.
type Error struct {
	// Op is the Desktop method or the step inside it ("reset", "setup
	// step 2 (launch)", "observe").
	Op string
	// Desktop names the desktop (a VM name, a guest URL, "fake#3").
	Desktop string
	Err     error
}

func (e *Error) Error() string {
	if e.Desktop == "" {
		return fmt.Sprintf("%s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("desktop %s: %s: %v", e.Desktop, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// IsFailure reports whether err, returned by a call made with ctx, means
// the desktop itself failed, so that the caller should replace it and may
// retry the attempt elsewhere. It is false for nil, once ctx is done (the
// caller gave up, whatever the error says), and for ErrUnsupported.
func IsFailure(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, ErrUnsupported)
}

// Retirer is implemented by desktops that can ask to be replaced while
// they work: the machine they run on is leaving (osworld: its libvirt
// host left the DNS name the hosts come from). A worker asks before each
// attempt it takes; a desktop that says yes is closed, as one that failed
// would be, and a new one made in its place, which goes to a machine that
// stays. Nothing counts it as a failure, and the attempt it ran last is
// recorded as it ended.
type Retirer interface {
	// Retiring reports whether the desktop wants to be replaced before
	// its next attempt.
	Retiring() bool
}

// Affinity says how fast a desktop can start an attempt at a task, as far
// as where the task's start state lies goes.
type Affinity int

const (
	// AnyDesktop: the desktop knows no reason to take the task or leave it.
	AnyDesktop Affinity = iota
	// HereFaster: the task's start state is ready where the desktop runs
	// (osworld: its golden state's fork template is on the desktop's
	// host): its attempt starts fastest here.
	HereFaster
	// ElsewhereFaster: the task's start state is ready only where other
	// desktops run; here the attempt sets the task up or loads it.
	ElsewhereFaster
)

// Placer is implemented by desktops that know where a task's attempts start
// fastest. A worker whose desktop is one takes, of the attempts queued
// next, one its desktop starts fastest (PickAttempt) instead of the first.
type Placer interface {
	// Affinity says whether the desktop starts attempts at the task
	// faster than others. It is called under the scheduler's lock: it must
	// be quick and must not block.
	Affinity(taskID string) Affinity
}

// Regrader is implemented by desktops that can grade the end state of the
// attempt they just graded once more without changing it: the evaluator's
// getters and metric run again, its postconfig does not (it ran, and it
// may change the state). Collect's grade-twice asks after Evaluate, to catch
// a grader that disagrees with itself: a reward the same end state does not
// reproduce is not one to train on.
type Regrader interface {
	EvaluateAgain(ctx context.Context, task Task) (float64, error)
}

// GradeExplainer is implemented by desktops that can say in words what
// their last grade (Evaluate) rested on: the value each result getter
// returned, or the rule that gave the reward. legato rl tasks check puts
// it in the evidence of a task whose untouched start state already scores,
// so its author sees which default of the image passes it. A desktop
// without it is graded the same; the evidence then holds the reward only.
type GradeExplainer interface {
	// ExplainGrade returns the explanation of the last Evaluate, "" when
	// it has none.
	ExplainGrade() string
}

// EndStateKeeper is implemented by desktops that can keep an attempt's end
// state, as it is before its grade, so that it can be graded again later
// (after the task's evaluator or config changed, with newer grading code)
// without running the agent again, on any desktop of the same backend
// (EndStateGrader). Kept states outlive the desktop and the batch.
type EndStateKeeper interface {
	// KeepEndState keeps the state now; name is unique in the batch
	// (the attempt's rollout id). The returned Ref names the state,
	// by its content where the backend can.
	KeepEndState(ctx context.Context, name string) (EndState, error)
	// DropEndState deletes a kept state, whichever desktop kept it.
	DropEndState(ctx context.Context, ref string) error
}

// EndStateGrader grades kept end states: it brings the state named ref
// back and grades it with task as Evaluate graded the attempt that ended
// there, whose last action was last (the evaluator's postconfig first).
// An error wrapping ErrNoEndState means the state is gone.
type EndStateGrader interface {
	GradeEndState(ctx context.Context, ref string, task Task, last Action) (float64, error)
}

// EndState is a kept end state.
type EndState struct {
	Ref   string
	Bytes int64
}

// EndStateRef is the name a backend gives a kept end state: its prefix
// (one per backend) and 32 hex digits of sum's first 16 bytes (the
// state's content hash, or random bytes where the backend has none). A
// name of this shape is safe as a file name.
func EndStateRef(prefix string, sum []byte) string {
	return prefix + hex.EncodeToString(sum[:16])
}

// IsEndStateRef reports whether ref has the shape EndStateRef gives with
// prefix: a backend checks a name it is handed before it builds a path of
// it, so no name reaches outside its directory of end states.
func IsEndStateRef(prefix, ref string) bool {
	h, ok := strings.CutPrefix(ref, prefix)
	if !ok || len(h) != 32 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// ErrNoEndState means a kept end state no longer exists (dropped to keep
// the batch's bound on space, or removed).
var ErrNoEndState = errors.New("no such kept end state")

// Reporter is implemented by desktops that say what they did for an
// attempt beyond the contract's calls: which reset brought the desktop to
// the task's start and why, and how each metric was graded. The scheduler
// asks once the attempt has been graded (or has ended otherwise) and keeps
// the answer in the attempt's record, so that a trainer can tell attempts
// that started or were graded differently apart.
type Reporter interface {
	AttemptReport() AttemptReport
}

// AttemptReport is what a Reporter says about the attempt since the last
// Reset.
type AttemptReport struct {
	// Reset names the reset that ran ("fast", "loadvm", "revert", ...) and
	// Why says why that one (its choice, or the fallback's cause).
	Reset    string
	ResetWhy string
	// Golden is the key of the golden state the attempt started from
	// (loaded or built by its reset), "" when it started otherwise. A
	// replay starts from the state of the same key, or refuses.
	Golden string
	// Grading lists the metrics the evaluator ran, in order, with how.
	Grading []MetricRun
	// Host names the machine the desktop runs on, when a backend spreads
	// desktops over several (osworld: the libvirt host's label), and VM
	// the desktop there (the domain's name), so a batch's desktops,
	// attempts, failures and phase times can be told apart per host.
	Host string
	VM   string
	// Ended lists the processes the reset ended (a fast reset: those of
	// the desktop's session and user started since the clean state), and
	// Spared those it found started since then but left running because
	// they are not the desktop's (another user's, the system's, another
	// session's).
	Ended, Spared []Process
	// UnsettledStart says the wait after the reset reached its bound
	// before the screen settled: the attempt's first screenshot shows a
	// screen still changing (a program that never stops animating, or one
	// still starting).
	UnsettledStart bool
}

// Process names a process in the desktop's guest.
type Process struct {
	PID  int
	Name string
	UID  int
}

// MetricRun is one metric of a grade.
type MetricRun struct {
	Metric string
	// Via is how it ran: "native" (Go) or "python" (OSWorld's own code).
	Via string
	// Result and Expected are digests of what the metric was given, the
	// values its result and expected getters returned (empty: no such
	// getter, the metric did not run, or the value has no stable form). A
	// grade of the same state gives the same digests: two grades that
	// disagree with equal inputs have a metric that disagrees with itself;
	// with unequal ones, the state or a getter changed.
	Result, Expected string
	// ResultGetter is the type of the metric's result getter, and
	// ResultValue what it returned, in brief: the text Result is the
	// digest of (Python's repr of the value, a file it fetched as "file
	// sha256:" and its content's digest), cut at 200 characters; "" when
	// Result is.
	ResultGetter, ResultValue string
}
