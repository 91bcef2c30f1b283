package rl

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// A batch is opened in one place, openBatch, whichever front door asks for
// it: Collect for a list of tasks, Serve for groups a trainer submits.
// What differs between the two is a batchDoor, so that a change to how a
// batch is set up (what a resume counts, warns of, repairs) reaches both.

// batchDoor is what a front door gives openBatch besides the policy and the
// options.
type batchDoor struct {
	// tasks are a collect's tasks, one group each; a service starts with
	// none and keeps its scheduler open for the groups it is given.
	tasks []Task
	// open is a service's batch: its scheduler takes groups as they are
	// submitted, and its settings live in its journal, not batch.json.
	open bool
	// restore, if set, adds the groups of the batch's earlier runs to b's
	// scheduler before resume reads their records, checking m against the
	// settings those runs kept (a service's journal). It may start b on
	// other servers (startOn): b's client is made after it.
	restore func(b *batch, m schema.Batch) error
	// onGroup is an open batch's OnGroup (a service's stream), and stale,
	// if set, says which graded tries are too old and run again.
	onGroup func(Group)
	stale   func(*Record) bool
	// held is the warning when a quarantine holds tasks of the batch at
	// its start.
	held string
}

// resumeFound is what openBatch found of a batch's earlier runs.
type resumeFound struct {
	// DroppedTail counts the bytes of a torn last line cut off
	// rollouts.jsonl.
	DroppedTail int64
	// Read is what resume read of rollouts.jsonl.
	Read schema.ReadStats
}

// openBatch opens the batch of pol and opts for a front door: the options
// with their defaults, checked; the harness; the run directory, created or
// repaired; the scheduler and the policy gate; what earlier runs left (the
// summary's outages, the records, their kept end states, the
// quarantine). The caller runs the batch, and closes b.client and b.store
// once it ended; on error openBatch closed what it opened.
func openBatch(pol PolicyConfig, opts CollectOptions, door batchDoor) (_ *batch, found resumeFound, err error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, found, err
	}
	if !door.open {
		if err := checkTasks(door.tasks, opts); err != nil {
			return nil, found, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
	}
	if pol.Logger == nil {
		pol.Logger = opts.Logger
	}
	if err := pol.Validate(); err != nil {
		return nil, found, err
	}
	harness := opts.Harness
	if harness == nil {
		harness = qwen.New(qwen.Config{ImageMax: opts.ImageMax})
	}
	m, err := batchManifest(door, pol, opts, harness)
	if err != nil {
		return nil, found, err
	}
	run, err := schema.Create(opts.Out)
	if err != nil {
		return nil, found, err
	}
	var client *policy.Replicas
	defer func() {
		if err != nil {
			if client != nil {
				client.Close()
			}
			run.Close()
		}
	}()
	if found.DroppedTail = run.DroppedTail(); found.DroppedTail > 0 {
		opts.Logger.Warn("cut a torn last line off rollouts.jsonl (a crash mid-write); its attempt runs again", "bytes", found.DroppedTail)
	}
	if err := repairRun(run, opts.Logger); err != nil {
		return nil, found, err
	}
	sched := newScheduler(door.tasks, pol, opts)
	sched.open = door.open
	// A service's is its journal's, which restore reads.
	sched.advStd = m.AdvantageStd
	b := &batch{tasks: door.tasks, pol: pol, opts: opts, harness: harness, store: run, log: opts.Logger,
		sched: sched, gate: newPolicyGate(pol.Version)}
	if door.restore != nil {
		if err := door.restore(b, m); err != nil {
			return nil, found, err
		}
	}
	if door.open {
		// moveMain waits for run's first server.
		b.ready = make(chan struct{})
		b.opts.OnGroup, b.stale = door.onGroup, door.stale
	}
	if client, err = policy.NewReplicas(b.pol); err != nil {
		return nil, found, err
	}
	b.client = client
	b.earlier = earlierRuns(opts.Out, opts.Logger)
	reruns := *m.ErrorReruns
	sched.errorReruns = reruns
	if opts.ErrorReruns < 0 {
		reruns = -1
	}
	if found.Read, err = sched.resume(opts.Out, reruns); err != nil {
		return nil, found, err
	}
	if b.quar, err = openQuarantine(opts.Out, opts.Quarantine, opts.QuarantineSetupFails, opts.Logger); err != nil {
		return nil, found, err
	}
	if b.skipped = sched.holdQuarantined(b.quar); len(b.skipped) > 0 {
		opts.Logger.Warn(door.held, "tasks", strings.Join(b.skipped, " "))
	}
	for _, s := range sched.keptEndStates {
		// The bound counts the earlier runs' states; dropping happens
		// with the next state kept.
		b.kept.add(s, math.MaxInt64)
	}
	if found.Read.TornLines > 0 { // repairRun moved them; only a race could leave one
		opts.Logger.Warn("skipped unreadable lines in rollouts.jsonl", "lines", found.Read.TornLines, "first", found.Read.FirstTorn)
	}
	if found.Read.Records > 0 {
		opts.Logger.Info("resuming batch", "records", found.Read.Records, "errors_rerun", sched.reran)
	}
	if !door.open {
		// A service keeps its settings in its journal (restore).
		if err := run.WriteBatch(&m); err != nil {
			return nil, found, err
		}
	}
	if door.open {
		// A service's Status reads it before run.
		b.started = time.Now()
	}
	return b, found, nil
}

// batchManifest describes the batch a door opens and checks it against
// the batch.json in opts.Out: a collect continues the batch it describes
// (from which it takes the bound on error reruns); a service refuses it,
// keeping its own settings in its journal.
func batchManifest(door batchDoor, pol PolicyConfig, opts CollectOptions, harness policy.Harness) (schema.Batch, error) {
	m := manifestFor(door.tasks, pol, opts, harness)
	if door.open {
		// A service's groups, and the versions they run with, come
		// and go.
		m.Version, m.TaskIDs, m.TasksSHA = "", nil, ""
		b, err := schema.ReadBatch(opts.Out)
		if err != nil {
			return m, err
		}
		if b != nil {
			return m, fmt.Errorf("%w: %s holds a collect batch (%s); serve into a directory of its own", ErrInvalidOptions, opts.Out, schema.BatchFile)
		}
		return m, nil
	}
	old, err := readManifest(opts.Out)
	if err != nil {
		return m, err
	}
	if old != nil {
		if err := continueBatch(opts.Out, schema.BatchFile, old, m, opts.Logger); err != nil {
			return m, err
		}
		// The batch's first run fixed the bound; --no-retry-errors still
		// turns reruns off.
		n := errorReruns(old)
		m.ErrorReruns = &n
	}
	m.AdvantageStd, err = keptAdvantageStd(schema.BatchFile, old, m.AdvantageStd)
	return m, err
}

// checkTasks refuses task lists a batch cannot run.
func checkTasks(tasks []Task, opts CollectOptions) error {
	if len(tasks) == 0 {
		return errors.New("no tasks")
	}
	if n := AttemptsPerTask(opts.Group, opts.Oversample); len(tasks) > MaxAttempts/n {
		return fmt.Errorf("%d tasks × %d attempts: more than %d attempts in one batch; split the tasks into several batches", len(tasks), n, MaxAttempts)
	}
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

// repairRun moves the lines of rollouts.jsonl that no reader may use
// (damaged lines, later duplicates of a final record) to the run's
// quarantine file before a resume reads it, so the resumed batch and its
// exports agree on every attempt, and logs each line moved.
func repairRun(run *schema.Run, log *slog.Logger) error {
	st, err := run.Repair()
	if err != nil {
		return fmt.Errorf("resume %s: %w", run.Dir(), err)
	}
	for _, l := range st.Lines {
		log.Warn("moved a line of rollouts.jsonl to "+schema.QuarantineFile, "line", l.Line, "reason", l.Reason)
	}
	return nil
}
