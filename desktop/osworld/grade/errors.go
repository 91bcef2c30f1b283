package grade

import (
	"errors"
	"fmt"
	"strings"

	"legato/rl/desktop"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrTimeout means a getter or metric ran longer than
	// GraderConfig.Timeout. A bridge process that timed out was killed; the
	// next grade starts a new one.
	ErrTimeout = errors.New("grader timed out")
	// ErrBridgeExited means the grader's Python process died (a metric
	// called os._exit, the interpreter crashed, it was killed). The next
	// grade starts a new one.
	ErrBridgeExited = errors.New("grader process exited")
	// ErrRefused is what a Guest returns, wrapped, when the guest server
	// answered a request with an error status (a missing file is a 404).
	// OSWorld hands the metric None in that case, and so do we; any other
	// Guest error means the guest could not be reached and fails the grade.
	ErrRefused = errors.New("guest server refused the request")
	// ErrNoFile is returned, wrapped, by a getter that finds no file (the
	// Python bridge reports a getter's FileNotFoundError the same way). As
	// in OSWorld, the metric it feeds then scores 0.
	ErrNoFile = errors.New("file not found")
)

// Error is a failure while grading one task: what was running and why it
// failed. A desktop backend reports it as an env failure of the attempt.
type Error struct {
	// TaskID is the task being graded.
	TaskID string
	// Metric is the metric's name, "" for the postconfig step.
	Metric string
	// Index is the metric's position in a list of metrics (0 for a single
	// metric).
	Index int
	// Op says which part failed: "postconfig", "result getter vm_file",
	// "expected getter rule", "metric", "bridge".
	Op  string
	Err error
}

func (e *Error) Error() string {
	if e.Metric == "" {
		return fmt.Sprintf("grade task %s: %s: %v", e.TaskID, e.Op, e.Err)
	}
	return fmt.Sprintf("grade task %s: metric %s (#%d): %s: %v", e.TaskID, e.Metric, e.Index, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// PythonError is an exception raised while running a getter or a metric:
// by OSWorld's own Python code through the bridge, or by the native Go
// version of the same code where Python would have raised.
type PythonError struct {
	// Type is the exception's class name (TypeError, KeyError, ...).
	Type    string
	Message string
	// Traceback is Python's formatted traceback; empty for native code.
	Traceback string
}

func (e *PythonError) Error() string {
	if e.Message == "" {
		return "raised " + e.Type
	}
	return "raised " + e.Type + ": " + e.Message
}

// UnsupportedError means a task cannot be graded by this grader: its
// evaluator is malformed, or names a metric or getter that is neither native
// nor importable from the OSWorld checkout, or needs something the grader
// was not given (a postconfig runner, a guest). It wraps
// desktop.ErrUnsupported, so the scheduler refuses the task instead of
// retrying it on another desktop.
type UnsupportedError struct {
	TaskID string
	// Metric is the metric concerned, "" for the evaluator as a whole.
	Metric string
	// Getter is the getter type concerned, "" when it is the metric.
	Getter string
	Reason string
}

func (e *UnsupportedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "task %s", e.TaskID)
	if e.Metric != "" {
		fmt.Fprintf(&b, ": metric %q", e.Metric)
	}
	if e.Getter != "" {
		fmt.Fprintf(&b, ": getter %q", e.Getter)
	}
	fmt.Fprintf(&b, ": %s", e.Reason)
	return b.String()
}

func (e *UnsupportedError) Unwrap() error { return desktop.ErrUnsupported }
