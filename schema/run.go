package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/singleflight"
)

// Names inside a run directory.
const (
	RecordsFile = "rollouts.jsonl" // one Record per line
	SummaryFile = "summary.json"   // the latest Summary
	MessagesDir = "messages"       // messages/<sha256>: zstd canonical JSON
	ImagesDir   = "images"         // images/<sha256>.png
)

// MaxRecordBytes bounds one line of rollouts.jsonl. A 15-step record with
// token ids and logprobs is a few hundred KB; the bound only keeps a reader's
// memory finite on a damaged file.
const MaxRecordBytes = 256 << 20

// tempPrefix starts the names of files being written; Create removes
// leftovers of a crashed writer, readers never open them.
const tempPrefix = ".tmp-"

// Run writes one run directory: records, content store and summary. It holds
// an exclusive lock on the directory until Close, so two batches never
// interleave their records. A Run is safe for concurrent use.
type Run struct {
	dir    string
	msgDir string
	imgDir string
	enc    *zstd.Encoder // EncodeAll only: safe for concurrent use

	// life is held shared by every operation and exclusively by Close, so
	// Close waits for writes in flight and nothing writes after it.
	life   sync.RWMutex
	closed bool

	appendMu sync.Mutex
	f        *os.File // rollouts.jsonl, O_APPEND; its flock guards the directory
	size     int64    // bytes of rollouts.jsonl that hold whole records
	// dirty: a failed append may have left bytes past size; they are cut
	// before the next record so no record is glued to a fragment.
	dirty bool

	summaryMu sync.Mutex

	// Hashes known to be stored, so that history messages repeated in every
	// prompt cost a hash and no syscall.
	msgs, imgs sync.Map // [32]byte → struct{}
	flight     singleflight.Group
	scratch    sync.Pool // *imageScratch
	// storeDirsDirty is set after a new name appears in messages/ or images/;
	// Append syncs those directories before writing a record that may
	// refer to it.
	storeDirsDirty atomic.Bool

	droppedTail int64
}

// Create opens the run directory dir for writing, creating it and its
// messages/ and images/ directories if needed. An existing run is continued:
// new records are appended after the old ones (resume). A torn last line
// left by a crash mid-append (its Append never returned) is cut off; see
// DroppedTail. Create fails with ErrLocked while another process writes dir.
func Create(dir string) (*Run, error) { return openRun(dir, true) }

// Open opens an existing run directory for writing, like Create, but fails
// (with an error matching fs.ErrNotExist) when dir holds no rollouts.jsonl.
func Open(dir string) (*Run, error) { return openRun(dir, false) }

func openRun(dir string, create bool) (_ *Run, err error) {
	if dir == "" {
		return nil, errors.New("open run: empty directory name: pass the run directory")
	}
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create run: %w", err)
		}
	}
	flags := os.O_RDWR | os.O_APPEND
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordsFile), flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open run: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := lockFile(f); err != nil {
		return nil, fmt.Errorf("open run %s: %w", dir, err)
	}
	r := &Run{
		dir:    dir,
		msgDir: filepath.Join(dir, MessagesDir),
		imgDir: filepath.Join(dir, ImagesDir),
		f:      f,
	}
	for _, d := range []string{r.msgDir, r.imgDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open run: %w", err)
		}
	}
	if r.size, r.droppedTail, err = cutTornTail(f); err != nil {
		return nil, fmt.Errorf("open run %s: %w", dir, err)
	}
	// The lock is ours, so any temp file is a crashed writer's leftover.
	for _, d := range []string{dir, r.msgDir, r.imgDir} {
		if err := removeTemps(d); err != nil {
			return nil, fmt.Errorf("open run: %w", err)
		}
	}
	// Make the new entries (rollouts.jsonl, messages/, images/) durable.
	if err := syncDir(dir); err != nil {
		return nil, fmt.Errorf("open run: %w", err)
	}
	r.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return nil, fmt.Errorf("open run: zstd: %w", err)
	}
	return r, nil
}

// cutTornTail truncates f after its last newline, so appends start on a line
// of their own. It returns the new size and the number of bytes cut.
func cutTornTail(f *os.File) (size, cut int64, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	end := fi.Size()
	buf := make([]byte, 64<<10)
	for pos := end; pos > 0; {
		n := min(int64(len(buf)), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil && err != io.EOF {
			return 0, 0, fmt.Errorf("read %s: %w", RecordsFile, err)
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			size = pos + int64(i) + 1
			break
		}
	}
	if size == end {
		return size, 0, nil
	}
	if err := f.Truncate(size); err != nil {
		return 0, 0, fmt.Errorf("cut torn tail of %s: %w", RecordsFile, err)
	}
	if err := f.Sync(); err != nil {
		return 0, 0, fmt.Errorf("cut torn tail of %s: %w", RecordsFile, err)
	}
	return size, end - size, nil
}

func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// Dir returns the run directory.
func (r *Run) Dir() string { return r.dir }

// DroppedTail returns how many bytes of a torn last line Create cut from
// rollouts.jsonl: the start of a record whose Append never returned. It is 0
// when the previous writer ended cleanly.
func (r *Run) DroppedTail() int64 { return r.droppedTail }

// Close releases the run directory. It waits for operations in flight; later
// calls return ErrClosed. Closing twice is not an error.
func (r *Run) Close() error {
	r.life.Lock()
	defer r.life.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	err := r.syncStoreDirs()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close run %s: %w", r.dir, err)
	}
	return nil
}

// Append writes rec as one line of rollouts.jsonl and syncs it to disk:
// once Append returns nil the record, and every message and image stored
// before it, survive a crash. If Append fails the record is not in the file.
// An empty rec.Schema is set to Version.
func (r *Run) Append(rec *Record) error {
	if rec == nil {
		return errors.New("append record: nil record")
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return ErrClosed
	}
	if rec.Schema == "" {
		rec.Schema = Version
	}
	if rec.Schema != Version {
		return fmt.Errorf("append record %q: %w %q: leave Schema empty or set it to %q", rec.RolloutID, ErrSchemaVersion, rec.Schema, Version)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		if where := nonFinite(rec); where != "" {
			err = fmt.Errorf("%s is not a finite number, which JSON cannot hold: %w", where, err)
		}
		return fmt.Errorf("append record %q: %w", rec.RolloutID, err)
	}
	if len(line)+1 > MaxRecordBytes {
		return fmt.Errorf("append record %q: %w: %d bytes, limit %d", rec.RolloutID, ErrRecordTooLarge, len(line)+1, MaxRecordBytes)
	}
	line = append(line, '\n')

	r.appendMu.Lock()
	defer r.appendMu.Unlock()
	if r.storeDirsDirty.Swap(false) {
		if err := r.syncStoreDirs(); err != nil {
			r.storeDirsDirty.Store(true)
			return fmt.Errorf("append record %q: %w", rec.RolloutID, err)
		}
	}
	if r.dirty {
		if err := r.f.Truncate(r.size); err != nil {
			return fmt.Errorf("append record %q: cut a failed append: %w", rec.RolloutID, err)
		}
		r.dirty = false
	}
	// One write of the whole line: with O_APPEND it lands at the end in one
	// piece, so a crash leaves at most a torn last line.
	n, err := r.f.Write(line)
	if err == nil {
		err = r.f.Sync()
	}
	if err != nil {
		// Cut what may have reached the file so a failed Append leaves no
		// record behind; if that fails too, the next Append retries it.
		r.dirty = true
		if terr := r.f.Truncate(r.size); terr == nil {
			r.dirty = false
		}
		return fmt.Errorf("append record %q: %w", rec.RolloutID, err)
	}
	r.size += int64(n)
	return nil
}

// syncStoreDirs makes new names in messages/ and images/ durable.
func (r *Run) syncStoreDirs() error {
	if err := syncDir(r.msgDir); err != nil {
		return err
	}
	return syncDir(r.imgDir)
}

// WriteSummary replaces summary.json with s atomically: readers see the old
// summary or the new one, never a mix. An empty s.Schema is set to
// SummaryVersion.
func (r *Run) WriteSummary(s *Summary) error {
	if s == nil {
		return errors.New("write summary: nil summary")
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return ErrClosed
	}
	if s.Schema == "" {
		s.Schema = SummaryVersion
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	b = append(b, '\n')
	// Serialized so that the last call's summary is the one left on disk.
	r.summaryMu.Lock()
	defer r.summaryMu.Unlock()
	if err := writeFileAtomic(r.dir, SummaryFile, b); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	if err := syncDir(r.dir); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// ReadSummary reads dir/summary.json.
func ReadSummary(dir string) (*Summary, error) {
	b, err := os.ReadFile(filepath.Join(dir, SummaryFile))
	if err != nil {
		return nil, fmt.Errorf("read summary: %w", err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read summary %s: %w", filepath.Join(dir, SummaryFile), err)
	}
	return &s, nil
}

// writeFileAtomic writes data to dir/name through a synced temp file and a
// rename, so dir/name is either absent or complete, also after a crash. The
// caller syncs dir to make the name itself durable.
func writeFileAtomic(dir, name string, data []byte) (err error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes 0600 files; the store is read by other tools too.
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// nonFinite names the first NaN or infinite number in rec, or returns "".
func nonFinite(rec *Record) string {
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	if rec.Reward != nil && bad(*rec.Reward) {
		return "reward"
	}
	t := rec.Timing
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"reset_s", t.ResetS}, {"wait_after_reset_s", t.WaitAfterResetS}, {"queue_s", t.QueueS},
		{"model_s", t.ModelS}, {"act_s", t.ActS}, {"wait_s", t.WaitS}, {"obs_s", t.ObsS},
		{"wait_before_eval_s", t.WaitBeforeEvalS}, {"eval_s", t.EvalS}, {"total_s", t.TotalS},
	} {
		if bad(f.v) {
			return "timing." + f.name
		}
	}
	for i, s := range rec.Steps {
		for j, lp := range s.Response.Logprobs {
			if bad(lp) {
				return fmt.Sprintf("steps[%d].response.logprobs[%d]", i, j)
			}
		}
		if bad(s.Model.Seconds) || bad(s.Model.QueueS) {
			return fmt.Sprintf("steps[%d].model", i)
		}
		for j, a := range s.Actions {
			if bad(a.ActS) || bad(a.WaitS) || bad(a.ReadyS) || bad(a.ObsS) {
				return fmt.Sprintf("steps[%d].actions[%d]", i, j)
			}
		}
	}
	return ""
}
