package qwen

import (
	"errors"
	"fmt"
)

// Sentinel errors a reply's parse error wraps, for callers that count
// failures by kind (errors.Is).
var (
	// ErrNoCall: the reply has no computer_use call at all.
	ErrNoCall = errors.New("no tool call in reply")
	// ErrSyntax: a tool call is not well-formed JSON or XML.
	ErrSyntax = errors.New("malformed tool call")
	// ErrUnknownFunction: a tool call names a function other than
	// computer_use.
	ErrUnknownFunction = errors.New("unknown function")
	// ErrUnknownAction: the action is not one of the tool's actions.
	ErrUnknownAction = errors.New("unknown action")
	// ErrMissingArgument: the action needs an argument the call lacks.
	ErrMissingArgument = errors.New("missing argument")
	// ErrBadArgument: an argument has the wrong type or shape.
	ErrBadArgument = errors.New("bad argument")
	// ErrOutOfRange: a coordinate, amount or length is out of bounds.
	ErrOutOfRange = errors.New("out of range")
	// ErrUnknownKey: a key name is not a pyautogui key.
	ErrUnknownKey = errors.New("unknown key")
	// ErrNoPrompt: Episode.Reply was called with no Prompt waiting for it.
	ErrNoPrompt = errors.New("reply without a prompt")
)

// ParseError is a reply that did not parse: which call of the reply (from
// 0, or -1 for the reply as a whole) and why.
type ParseError struct {
	Call   int
	Action string // the call's action, when known
	Err    error
}

func (e *ParseError) Error() string { return "qwen reply: " + e.detail() }

// detail is the error without the package's prefix, as the model is told.
func (e *ParseError) detail() string {
	switch {
	case e.Call < 0:
		return e.Err.Error()
	case e.Action == "":
		return fmt.Sprintf("call %d: %v", e.Call, e.Err)
	}
	return fmt.Sprintf("call %d (%s): %v", e.Call, e.Action, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }
