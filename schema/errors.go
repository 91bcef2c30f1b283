package schema

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrClosed is returned by a Run or MessageStore used after Close.
	ErrClosed = errors.New("use of a closed run or message store")
	// ErrLocked means another process is writing the run directory.
	ErrLocked = errors.New("run directory is in use by another process")
	// ErrNotFound means a message or image is not in the run's store.
	ErrNotFound = errors.New("not in the run's store")
	// ErrCorrupt means a stored message or image does not match its hash
	// or cannot be decoded.
	ErrCorrupt = errors.New("corrupt store object")
	// ErrBadHash means a hash is not 64 lowercase hex digits.
	ErrBadHash = errors.New("malformed hash (want 64 lowercase hex digits)")
	// ErrBadImage means an image data URL is not a base64 PNG.
	ErrBadImage = errors.New("unsupported image")
	// ErrSchemaVersion means a record was written in a format other than
	// Version (by another legato release).
	ErrSchemaVersion = errors.New("unsupported record schema")
	// ErrRecordTooLarge means a record does not fit in one line of
	// MaxRecordBytes.
	ErrRecordTooLarge = errors.New("record too large")
)

// ObjectError is an error about one object of a run's content store.
type ObjectError struct {
	Op   string // "put" or "load"
	Kind string // "message", "image" or "token chunk"
	// Hash names the object; empty when the failure came before hashing.
	Hash string
	Err  error
}

func (e *ObjectError) Error() string {
	if e.Hash == "" {
		return fmt.Sprintf("%s %s: %v", e.Op, e.Kind, e.Err)
	}
	return fmt.Sprintf("%s %s %s: %v", e.Op, e.Kind, e.Hash, e.Err)
}

func (e *ObjectError) Unwrap() error { return e.Err }

// LineError locates a line of rollouts.jsonl and says what is wrong with it.
type LineError struct {
	Line   int   // 1-based line number
	Offset int64 // byte offset of the line's start
	Err    error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("rollouts.jsonl line %d (offset %d): %v", e.Line, e.Offset, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }
