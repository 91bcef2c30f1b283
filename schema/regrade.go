package schema

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ReplayFile is the report legato rl replay writes into a run directory.
const ReplayFile = "replay.json"

// Regrade is one line of a run's regrades.jsonl: a kept end state graded
// again, the new reward beside the recorded one (which is never changed).
type Regrade struct {
	RolloutID string `json:"rollout_id"`
	TaskID    string `json:"task_id"`
	// Reward is the record's reward; Regraded the new grade, null when it
	// failed (Error says why).
	Reward   *float64 `json:"reward"`
	Regraded *float64 `json:"regraded"`
	// TaskSHA is the SHA-256 of the task's config it was graded with now,
	// RecordedTaskSHA the one the attempt ran.
	TaskSHA         string `json:"task_sha256"`
	RecordedTaskSHA string `json:"recorded_task_sha256,omitempty"`
	EndState        string `json:"end_state"`
	Error           string `json:"error,omitempty"`
	At              Time   `json:"at"`
}

// AppendRegrades appends lines to dir's regrades.jsonl and syncs it. A
// torn last line a crash left is cut first.
func AppendRegrades(dir string, lines []Regrade) error {
	f, _, err := OpenJSONLines(filepath.Join(dir, RegradeFile), func(line []byte) error {
		_, err := decodeRegrade(line)
		return err
	})
	if err != nil {
		return fmt.Errorf("write regrades: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range lines {
		if err := enc.Encode(&lines[i]); err != nil {
			f.Close()
			return fmt.Errorf("write regrades: %w", err)
		}
	}
	if err := w.Flush(); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write regrades: %w", err)
	}
	return nil
}

// LatestRegrades reads dir's regrades.jsonl and returns, per rollout, the
// last regrade that gave a reward; none when the file is missing. A torn
// last line (a crash mid-append) is skipped; another unreadable line is an
// error naming it.
func LatestRegrades(dir string) (map[string]Regrade, error) {
	path := filepath.Join(dir, RegradeFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Regrade{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]Regrade{}
	if _, err := ReadJSONLines(f, func(line []byte) error {
		r, err := decodeRegrade(line)
		if err == nil && r.Regraded != nil {
			out[r.RolloutID] = r
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("read %s: %w: fix or move the file", path, err)
	}
	return out, nil
}

// decodeRegrade decodes one line of regrades.jsonl.
func decodeRegrade(line []byte) (Regrade, error) {
	var r Regrade
	if err := json.Unmarshal(line, &r); err != nil {
		return r, err
	}
	if r.RolloutID == "" {
		return r, errors.New("not a regrade: no rollout_id")
	}
	return r, nil
}
