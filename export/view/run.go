// Package view is `legato rl view`: web pages of a run directory — the run
// with its filters and per-task table, a group's attempts side by side, an
// attempt step by step with the screenshot the model saw and what its
// actions did drawn over it — served on loopback (Handler) or written as
// static files (WriteStatic).
//
// It reads a run through schema and never writes a run's files. A run of
// thousands of attempts is not loaded whole: opening it reads each record
// once for a row of the index (ids, status, reward, byte offset), and a
// page reads the records it shows by their offsets (schema.ReadRecordsAt).
package view

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"legato/rl/schema"
)

// ErrNotRun is wrapped by Open's error when the directory is not a run
// directory.
var ErrNotRun = errors.New("not a run directory")

// row is what the index keeps of one record: enough to filter, count and
// list it, and where its line starts.
type row struct {
	ID, Task, TaskSHA, Domain, Group, Version string
	Attempt, Steps                            int
	Status                                    schema.Status
	Reward                                    float64
	Graded                                    bool // Reward holds a reward
	Quarantined                               bool
	Off                                       int64
}

// Run is an open run directory. It is safe for concurrent use.
type Run struct {
	dir    string
	store  *schema.MessageStore
	batch  *schema.Batch
	coords string
	// advStd is the std of the batch's advantages, which a group's page
	// shows as export computes them.
	advStd schema.AdvantageStd

	mu        sync.Mutex
	size      int64     // of rollouts.jsonl when last indexed
	sides     [3]string // sideFiles when last read
	lastOff   int64     // the offset of the last record indexed
	lastID    string    // and its rollout id
	rows      []row
	byID      map[string]int
	torn      int // unreadable lines before the last record
	tornAfter int // and after it
	regrades  map[string]schema.Regrade
	replays   map[string]replayAttempt
	quar      *schema.Quarantine
}

// replayAttempt is what the view shows of an attempt's replay: the part of
// replay.json (legato/rl's ReplayReport) about it.
type replayAttempt struct {
	RolloutID       string   `json:"rollout_id"`
	RecordedReward  *float64 `json:"recorded_reward"`
	ReplayedReward  *float64 `json:"replayed_reward"`
	RewardAgrees    bool     `json:"reward_agrees"`
	FirstDivergence int      `json:"first_divergence"`
	Error           string   `json:"error"`
	Screens         []struct {
		Step      int     `json:"step"`
		Identical bool    `json:"identical"`
		Distance  float64 `json:"distance"`
		Recorded  string  `json:"recorded"`
		Replayed  string  `json:"replayed"`
	} `json:"screens"`
}

// Open opens the run directory dir: it must hold rollouts.jsonl and the
// content store legato writes beside it.
func Open(dir string) (*Run, error) {
	if fi, err := os.Stat(filepath.Join(dir, schema.RecordsFile)); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: no %s in it; pass the directory collect or serve wrote (--out)", dir, ErrNotRun, schema.RecordsFile)
	}
	b, err := schema.ReadBatch(dir)
	if err != nil {
		return nil, err
	}
	advStd, err := schema.RecordedAdvantageStd(dir)
	if err != nil {
		return nil, err
	}
	store, err := schema.OpenMessageStore(dir, schema.StoreOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", dir, ErrNotRun, err)
	}
	r := &Run{dir: dir, store: store, batch: b, coords: coordsOf(b), advStd: advStd, size: -1}
	if err := r.refresh(); err != nil {
		store.Close()
		return nil, err
	}
	return r, nil
}

// Close releases the run's store.
func (r *Run) Close() error { return r.store.Close() }

// Dir is the run directory.
func (r *Run) Dir() string { return r.dir }

// refresh brings the index up to date: a run being written (`legato rl
// serve` shows its live run) gains records, and replay, regrade and
// quarantine files may appear. Records are read from the last one indexed
// on, unless the file shrank or that record moved (a repair rewrote it):
// then from the start.
func (r *Run) refresh() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := os.Stat(filepath.Join(r.dir, schema.RecordsFile))
	if err != nil {
		return fmt.Errorf("index the run: %w", err)
	}
	sides := sideFiles(r.dir)
	if fi.Size() == r.size && sides == r.sides {
		return nil
	}
	quar, err := schema.ReadQuarantine(filepath.Join(r.dir, schema.TaskQuarantineFile))
	if err != nil {
		return err
	}
	regrades, err := schema.LatestRegrades(r.dir)
	if err != nil {
		return err
	}
	replays, err := readReplay(r.dir)
	if err != nil {
		return err
	}
	// The rows are copied: pages being made hold the old ones.
	rows, byID := slices.Clone(r.rows), maps.Clone(r.byID)
	from, torn := r.lastOff, r.torn
	if fi.Size() < r.size || len(rows) == 0 || !r.lastStill() {
		rows, byID, from, torn = nil, map[string]int{}, 0, 0
	}
	last, lastID := r.lastOff, r.lastID
	lastLine := 0
	st, err := schema.ReadRunRecordsFrom(r.dir, from, func(rec schema.Record, line int, off int64) error {
		lastLine = line
		if len(rows) > 0 && off <= last {
			return nil // the last record indexed, read again
		}
		last, lastID = off, rec.RolloutID
		rw := row{ID: rec.RolloutID, Task: rec.TaskID, TaskSHA: rec.TaskSHA, Domain: rec.Domain, Group: rec.GroupID, Version: rec.Policy.Version,
			Attempt: rec.Attempt, Steps: len(rec.Steps), Status: rec.Status, Off: off}
		if rec.Reward != nil {
			rw.Reward, rw.Graded = *rec.Reward, true
		}
		// A later record of the same id (none but in a damaged run) is
		// the one shown.
		if i, dup := byID[rw.ID]; dup {
			rows[i] = rw
			return nil
		}
		byID[rw.ID] = len(rows)
		rows = append(rows, rw)
		return nil
	})
	if err != nil {
		return fmt.Errorf("index the run: %w", err)
	}
	for i := range rows {
		e, ok := quar.Tasks[rows[i].Task]
		rows[i].Quarantined = ok && (rows[i].TaskSHA == "" || e.TaskSHA == rows[i].TaskSHA)
	}
	r.rows, r.byID, r.lastOff, r.lastID, r.size, r.sides = rows, byID, last, lastID, fi.Size(), sides
	// Unreadable lines before the last record stay counted; those after
	// it (a torn tail, a record being written) are read again next time.
	after := min(st.TornLines, st.Lines-lastLine)
	r.torn, r.tornAfter = torn+st.TornLines-after, after
	r.regrades, r.replays, r.quar = regrades, replays, quar
	return nil
}

// lastStill reports whether the record last indexed is still where it was.
func (r *Run) lastStill() bool {
	recs, err := schema.ReadRecordsAt(r.dir, []int64{r.lastOff})
	return err == nil && recs[0].RolloutID == r.lastID
}

// sideFiles is the size and time of the files beside rollouts.jsonl that
// pages show, to see when one changed.
func sideFiles(dir string) [3]string {
	var out [3]string
	for i, name := range []string{schema.TaskQuarantineFile, schema.RegradeFile, schema.ReplayFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			out[i] = fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return out
}

// readReplay reads replay.json's attempts by rollout id; none without it.
func readReplay(dir string) (map[string]replayAttempt, error) {
	data, err := os.ReadFile(filepath.Join(dir, schema.ReplayFile))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]replayAttempt{}, nil
	}
	if err != nil {
		return nil, err
	}
	var rep struct {
		Attempts []replayAttempt `json:"attempts"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, schema.ReplayFile), err)
	}
	out := make(map[string]replayAttempt, len(rep.Attempts))
	for _, a := range rep.Attempts {
		out[a.RolloutID] = a
	}
	return out, nil
}

// snapshot returns the index as of now; the rows are shared, never changed
// (refresh builds new ones).
func (r *Run) snapshot() index {
	r.mu.Lock()
	defer r.mu.Unlock()
	return index{rows: r.rows, byID: r.byID, torn: r.torn + r.tornAfter, regrades: r.regrades, replays: r.replays, quar: r.quar}
}

type index struct {
	rows     []row
	byID     map[string]int
	torn     int
	regrades map[string]schema.Regrade
	replays  map[string]replayAttempt
	quar     *schema.Quarantine
}

// record reads the record of row i by its offset.
func (r *Run) record(rw row) (schema.Record, error) {
	recs, err := schema.ReadRecordsAt(r.dir, []int64{rw.Off})
	if err != nil {
		return schema.Record{}, err
	}
	return recs[0], nil
}
