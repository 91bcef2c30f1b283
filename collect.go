package rl

import "context"

// Collect runs a batch: every task's group of attempts, on opts.Desktops
// desktops, against the model server of pol, written to opts.Out.
//
// Cancelling ctx stops new attempts, cancels running ones, closes every
// desktop, writes the summary and returns it with ctx's error. Attempts
// that were interrupted leave no record (one already graded is kept);
// collecting into the same directory again runs them. The batch also stops,
// the same way, when the run directory cannot be written, the model server
// refuses the key or the model (401, 403, 404), or it stays away longer than
// ServerDownTimeout (ErrServerDown): Collect then returns that error. A
// server that goes away and comes back within it costs time, not
// attempts. Otherwise the returned error is nil when every group closed, and
// an *IncompleteError when some could not (the error records say why; it
// counts those that collecting again reruns, see ErrorReruns).
func Collect(ctx context.Context, tasks []Task, pol PolicyConfig, opts CollectOptions) (*Summary, error) {
	b, _, err := openBatch(pol, opts, batchDoor{tasks: tasks, held: "not running tasks a quarantine holds"})
	if err != nil {
		return nil, err
	}
	return b.runAndClose(ctx)
}
