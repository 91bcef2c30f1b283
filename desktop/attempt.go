package desktop

import "context"

// Attempt identifies the try of an attempt that a call belongs to. The
// scheduler puts it in the ctx of every call of an attempt (Reset through
// Evaluate), so that a backend can key per-attempt behaviour on it: the
// fake desktop draws its rewards from it, so that the same seed gives the
// same rewards whatever desktop runs the attempt; a VM backend can name
// the attempt in its logs.
type Attempt struct {
	// GroupID is the task's group in the batch.
	GroupID string
	// TaskID is the task's id.
	TaskID string
	// Index is the attempt's place in its group, from 0.
	Index int
	// Try counts the earlier tries of this attempt that a desktop failure
	// ended, from 0.
	Try int
}

type attemptKey struct{}

// WithAttempt returns ctx carrying a.
func WithAttempt(ctx context.Context, a Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// AttemptFrom returns the attempt ctx carries, if any.
func AttemptFrom(ctx context.Context) (Attempt, bool) {
	a, ok := ctx.Value(attemptKey{}).(Attempt)
	return a, ok
}
