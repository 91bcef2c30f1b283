package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// QuarantineVersion is the value of a quarantine file's "schema" field.
const QuarantineVersion = "legato.quarantine/v0"

// TaskQuarantineFile is the name of a run directory's task quarantine: the tasks its
// batches found unfit to train on. A file of the same format can be shared
// across batches (collect --quarantine FILE).
const TaskQuarantineFile = "quarantine.json"

// Why a task is quarantined.
const (
	// QuarantineGraderDisagrees: graded twice on the same end state, the
	// evaluator gave two rewards.
	QuarantineGraderDisagrees = "grader_disagrees"
	// QuarantineSetupFails: its reset (setup steps) failed on several
	// desktops.
	QuarantineSetupFails = "setup_fails"
	// QuarantineRewardOutOfRange: its evaluator returned a reward outside
	// [0, 1].
	QuarantineRewardOutOfRange = "reward_out_of_range"
	// QuarantineReplayDiverges: replays of its attempts did not reproduce
	// their first screen, so its start state is not what it was.
	QuarantineReplayDiverges = "replay_diverges"
	// QuarantineGraderFails: its grader failed on a start state (legato
	// rl tasks check).
	QuarantineGraderFails = "grader_fails"
	// QuarantineSolvedAtStart: its untouched start state already scores
	// above 0 (legato rl tasks check): a policy would be rewarded for
	// doing nothing.
	QuarantineSolvedAtStart = "solved_at_start"
)

// Quarantine is a quarantine file: the tasks not to train on, by id.
type Quarantine struct {
	Schema string                     `json:"schema"`
	Tasks  map[string]QuarantinedTask `json:"tasks"`
}

// QuarantinedTask says why a task is quarantined and what showed it.
type QuarantinedTask struct {
	// TaskSHA is the SHA-256 of the task's config as quarantined: the
	// same id with another config (the task was fixed) is not held.
	TaskSHA string `json:"task_sha256"`
	Reason  string `json:"reason"`
	// Evidence says what was seen, in words; Rollouts names the records
	// that showed it and Run the run directory they are in.
	Evidence string   `json:"evidence"`
	Run      string   `json:"run,omitempty"`
	Rollouts []string `json:"rollouts,omitempty"`
	Since    Time     `json:"since"`
}

// Holds returns the entry of task id when the quarantine holds it with the
// config whose SHA-256 is sha.
func (q *Quarantine) Holds(id, sha string) (QuarantinedTask, bool) {
	if q == nil {
		return QuarantinedTask{}, false
	}
	e, ok := q.Tasks[id]
	return e, ok && e.TaskSHA == sha
}

// IDs returns the quarantined task ids in order.
func (q *Quarantine) IDs() []string {
	if q == nil {
		return nil
	}
	ids := make([]string, 0, len(q.Tasks))
	for id := range q.Tasks {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// ReadQuarantine reads the quarantine file at path; a missing file is an
// empty quarantine.
func ReadQuarantine(path string) (*Quarantine, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Quarantine{Schema: QuarantineVersion, Tasks: map[string]QuarantinedTask{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read quarantine: %w", err)
	}
	var q Quarantine
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("quarantine %s is not a quarantine file (%v): fix or remove it", path, err)
	}
	if q.Schema != QuarantineVersion {
		return nil, fmt.Errorf("quarantine %s has schema %q, want %q", path, q.Schema, QuarantineVersion)
	}
	for id, e := range q.Tasks {
		if e.TaskSHA == "" || e.Reason == "" {
			return nil, fmt.Errorf("quarantine %s: task %q lacks its task_sha256 or reason: fix or remove the entry", path, id)
		}
	}
	if q.Tasks == nil {
		q.Tasks = map[string]QuarantinedTask{}
	}
	return &q, nil
}

// AddQuarantined puts the tasks of add into the quarantine file at path,
// keeping the entries it has (an entry for the same task and config stays
// as first written), and reports the ids it added. Batches sharing the file
// may add at once: each takes a lock beside the file (path + ".lock") for
// its read and write, and the file is replaced atomically, so a reader sees
// the old or the new whole file.
func AddQuarantined(path string, add map[string]QuarantinedTask) ([]string, error) {
	if len(add) == 0 {
		return nil, nil
	}
	unlock, err := lockWait(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("lock quarantine %s: %w", path, err)
	}
	defer unlock()
	q, err := ReadQuarantine(path)
	if err != nil {
		return nil, err
	}
	var added []string
	for id, e := range add {
		if old, ok := q.Tasks[id]; ok && old.TaskSHA == e.TaskSHA {
			continue
		}
		q.Tasks[id] = e
		added = append(added, id)
	}
	sort.Strings(added)
	if len(added) == 0 {
		return nil, nil
	}
	_, err = WriteFileAtomic(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(q)
	})
	return added, err
}

// lockWait takes an exclusive lock on the file at path (created if need
// be), waiting for another holder, and returns its release.
func lockWait(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockFileWait(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
