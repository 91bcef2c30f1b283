// Package desktoptest checks that a desktop.Desktop keeps the contract of
// package desktop, the way testing/fstest checks an fs.FS. A backend runs the
// whole suite in one line:
//
//	func TestConformance(t *testing.T) {
//		desktoptest.Run(t, func(t *testing.T) desktop.Desktop { return newMyDesktop(t) }, desktoptest.Options{})
//	}
//
// The checks cover one attempt from Reset to Evaluate with every kind of
// action, the screenshot (a PNG of the declared size), the reward range and
// OSWorld's infeasible semantics, cancellation of every blocking method
// (before and during the call), Close (idempotent, concurrent, interrupting
// a running call, ErrClosed afterwards) and goroutine leaks.
//
// # Cancellation
//
// The contract asks every blocking method to return soon after its ctx is
// done, with an error wrapping ctx.Err(). The suite reads it so:
//
//   - A ctx cancelled while the call runs: the call returns within
//     Options.Bound, with an error wrapping context.Canceled, or nil if it
//     had finished its work before it noticed (a race the caller cannot tell
//     from finishing just before the cancel).
//   - A ctx already cancelled when the call starts: the same. A call that
//     needs no waiting (an in-memory Observe) may complete and return nil,
//     as non-blocking operations of the standard library do without looking
//     at their ctx; a call that would wait must not start waiting.
//
// A call running when the desktop is closed from another goroutine must
// return within Bound too, with any error (a VM destroyed under a request may
// surface as a connection error); Close itself must return within Bound, and
// every later call must fail with an error wrapping desktop.ErrClosed.
//
// To cancel "during" a call the suite waits until the backend first asks
// for the call's ctx.Done (which it does when it selects on it, derives a
// ctx from it or hands it to net/http), then cancels. A backend whose calls
// return too quickly to be interrupted passes these checks trivially; give
// Options.Blocking to make them bite.
//
// # Leaks
//
// Each check snapshots the running goroutines before creating its desktops
// and reports any goroutine still running after it closed them, using
// goleak. Do not run the suite in parallel with tests that start goroutines
// (no t.Parallel around it), or set Options.SkipLeakCheck.
package desktoptest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"legato/rl/desktop"
)

// DefaultBound is how long a method may take to return after its ctx is
// cancelled or the desktop closed, when Options.Bound is zero.
const DefaultBound = 2 * time.Second

// Options configures the checks. The zero value checks any backend that can
// run an infeasible task with no setup steps.
type Options struct {
	// Tasks are reset to, each in turn, by the checks that observe and
	// evaluate; the first is used by the others. Empty means
	// DefaultTask() alone.
	Tasks []desktop.Task
	// Width and Height, when set, are the screen size every Observation
	// must declare.
	Width, Height int
	// Actions are the Code actions tried; empty means DefaultActions().
	Actions []desktop.Action
	// Bound is how long a method may take to return once its ctx is
	// cancelled or the desktop closed; zero means DefaultBound.
	Bound time.Duration
	// Blocking, when set, returns a desktop on which method m blocks until
	// its ctx is done or the desktop closed, while the other methods work
	// (for a fake, a hang injected into m). The checks that interrupt a
	// running call use it, so that they interrupt a call that is really
	// running; without it they use the desktops of newDesktop.
	Blocking func(ctx context.Context, m Method) (desktop.Desktop, error)
	// SkipLeakCheck turns the goroutine leak check off.
	SkipLeakCheck bool
}

// Method names a blocking method of desktop.Desktop.
type Method string

// The blocking methods, in the order of an attempt.
const (
	MethodReset          Method = "Reset"
	MethodWaitAfterReset Method = "WaitAfterReset"
	MethodObserve        Method = "Observe"
	MethodAct            Method = "Act"
	MethodWaitBeforeEval Method = "WaitBeforeEval"
	MethodEvaluate       Method = "Evaluate"
)

// methods returns the blocking methods in the order of an attempt.
func methods() []Method {
	return []Method{MethodReset, MethodWaitAfterReset, MethodObserve, MethodAct, MethodWaitBeforeEval, MethodEvaluate}
}

// DefaultTask returns the task the checks use when Options.Tasks is empty:
// an OSWorld infeasible task with no setup, which every backend can reset to
// and grade without a guest-side getter.
func DefaultTask() desktop.Task {
	return desktop.Task{
		ID:          "desktoptest-infeasible",
		Domain:      "os",
		Instruction: "Change the colour of the sky. (A conformance check: the only right answer is FAIL.)",
		Evaluator:   json.RawMessage(`{"func":"infeasible"}`),
	}
}

// DefaultActions returns the Code actions the checks try when
// Options.Actions is empty: a click, a hotkey and typing, as pyautogui code.
func DefaultActions() []desktop.Action {
	return []desktop.Action{
		{Kind: desktop.Code, Code: "pyautogui.click(100, 100)"},
		{Kind: desktop.Code, Code: "pyautogui.hotkey('ctrl', 'a')"},
		{Kind: desktop.Code, Code: "pyautogui.typewrite('legato')"},
	}
}

func (o Options) withDefaults() Options {
	if len(o.Tasks) == 0 {
		o.Tasks = []desktop.Task{DefaultTask()}
	}
	if len(o.Actions) == 0 {
		o.Actions = DefaultActions()
	}
	if o.Bound <= 0 {
		o.Bound = DefaultBound
	}
	return o
}

func (o Options) validate() error {
	if o.Width < 0 || o.Height < 0 {
		return fmt.Errorf("Width %d and Height %d must not be negative (0: any size)", o.Width, o.Height)
	}
	for i, a := range o.Actions {
		if a.Kind != desktop.Code {
			return fmt.Errorf("Actions[%d] is %v: list Code actions only; WAIT, DONE and FAIL are always tried", i, a)
		}
	}
	return nil
}

// Failure is one problem found by one check.
type Failure struct {
	// Check names the check, as Run names its subtest ("Close/Twice").
	Check string
	Err   error
}

func (f Failure) Error() string { return f.Check + ": " + f.Err.Error() }

func (f Failure) Unwrap() error { return f.Err }

// Run runs every check as a subtest of t, each on desktops from newDesktop,
// which fails t if it cannot make one; the suite closes every desktop it
// gets.
func Run(t *testing.T, newDesktop func(t *testing.T) desktop.Desktop, opts Options) {
	t.Helper()
	if err := opts.validate(); err != nil {
		t.Fatalf("desktoptest options: %v", err)
	}
	opts = opts.withDefaults()
	for _, c := range checks() {
		t.Run(c.name, func(t *testing.T) {
			newD := func(context.Context) (desktop.Desktop, error) { return newDesktop(t), nil }
			for _, err := range runCheck(t.Context(), c, newD, opts) {
				t.Error(err)
			}
		})
	}
}

// Check runs every check on desktops from newDesktop, one after the other,
// and returns what failed, in the order of the checks; none means the
// backend conforms. It is Run without a testing.T, for checking the suite
// itself and for running it outside go test.
func Check(ctx context.Context, newDesktop func(ctx context.Context) (desktop.Desktop, error), opts Options) []Failure {
	if err := opts.validate(); err != nil {
		return []Failure{{Check: "Options", Err: err}}
	}
	opts = opts.withDefaults()
	var fails []Failure
	for _, c := range checks() {
		for _, err := range runCheck(ctx, c, newDesktop, opts) {
			fails = append(fails, Failure{Check: c.name, Err: err})
		}
	}
	return fails
}

// CheckNames returns the names of the checks, in the order they run; a
// Failure's Check is one of them.
func CheckNames() []string {
	var names []string
	for _, c := range checks() {
		names = append(names, c.name)
	}
	return names
}
