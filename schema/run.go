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
	"slices"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
)

// Names inside a run directory.
const (
	RecordsFile  = "rollouts.jsonl" // one Record per line
	SummaryFile  = "summary.json"   // the latest Summary
	MessagesDir  = "messages"       // messages/pack-<n>: packed zstd canonical JSON (older runs: messages/<sha256>)
	ImagesDir    = "images"         // images/<sha256>.png
	TokensDir    = "tokens"         // tokens/pack-<n>: packed zstd chunks of prompt token ids (older runs: tokens/<sha256>)
	ServiceFile  = "service.jsonl"  // a service's journal: its groups, policy changes and stream
	RegradeFile  = "regrades.jsonl" // one Regrade per line: kept end states graded again
	EndStatesDir = "end-states"     // end-states/: kept end states (a file or directory each)
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
	tokDir string
	enc    *zstd.Encoder // EncodeAll only: safe for concurrent use

	// life is held shared by every operation and exclusively by Close, so
	// Close waits for writes in flight and nothing writes after it.
	life   sync.RWMutex
	closed bool

	// Appends commit in groups (see Append): commitMu guards the chain of
	// groups; the group at the head of the chain owns f, size and cutTail
	// while it commits, and groups commit one at a time.
	commitMu sync.Mutex
	open     *commitGroup // taking lines; nil until the next Append
	last     *commitGroup // the newest group; a new group commits after it

	f    *os.File // rollouts.jsonl, O_APPEND; its flock guards the directory
	size int64    // bytes of rollouts.jsonl that hold whole records
	// cutTail: a failed commit may have left bytes past size; they are cut
	// before the next record so no record is glued to a fragment.
	cutTail bool

	summaryMu sync.Mutex

	// Hashes known to be stored, so that history messages repeated in every
	// prompt cost a hash and no syscall.
	msgs, imgs, toks sync.Map // [32]byte → struct{}
	// msgPack and tokPack take new messages and token chunks (see
	// packWriter); images are files of their own.
	msgPack, tokPack *packWriter
	flight           singleflight.Group
	scratch          sync.Pool // *imageScratch

	// unsynced holds the content files renamed into place but not yet
	// fsynced. PutMessages leaves syncing to the next commit, which syncs
	// them and their directories before it writes a record that may refer
	// to them: the step path pays no fsync, and concurrent records share
	// the syncs.
	unsyncedMu sync.Mutex
	unsynced   map[string]storedObject // path → object

	hooks hooks

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
		if err := os.MkdirAll(dir, dirMode); err != nil {
			return nil, fmt.Errorf("create run: %w", err)
		}
	}
	flags := os.O_RDWR | os.O_APPEND
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordsFile), flags, fileMode)
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
		tokDir: filepath.Join(dir, TokensDir),
		f:      f,
	}
	r.msgPack = &packWriter{dir: r.msgDir, known: &r.msgs}
	r.tokPack = &packWriter{dir: r.tokDir, known: &r.toks}
	for _, d := range []string{r.msgDir, r.imgDir, r.tokDir} {
		if err := os.MkdirAll(d, dirMode); err != nil {
			return nil, fmt.Errorf("open run: %w", err)
		}
	}
	if r.size, r.droppedTail, err = cutTornTail(f); err != nil {
		return nil, fmt.Errorf("open run %s: %w", dir, err)
	}
	// The lock is ours, so any temp file is a crashed writer's leftover.
	for _, d := range []string{dir, r.msgDir, r.imgDir, r.tokDir} {
		if err := removeTemps(d); err != nil {
			return nil, fmt.Errorf("open run: %w", err)
		}
	}
	// Make the new entries (rollouts.jsonl, messages/, images/, tokens/)
	// durable.
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
// calls return ErrClosed. Closing twice is not an error. Content stored by
// PutMessages is synced even if no record refers to it.
func (r *Run) Close() error {
	r.life.Lock()
	defer r.life.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	// No Append holds life, so no commit is in flight.
	err := r.syncContent()
	for _, p := range []*packWriter{r.msgPack, r.tokPack} {
		if cerr := p.close(); err == nil {
			err = cerr
		}
	}
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
//
// Concurrent Appends share their syncs: records that arrive while a commit
// is in flight form the next group, which syncs the content stored so far,
// writes its lines and syncs rollouts.jsonl once for all of them.
func (r *Run) Append(rec *Record) error {
	_, err := r.AppendAt(rec)
	return err
}

// AppendAt is Append, returning the byte offset of rec's line in
// rollouts.jsonl, for ReadRecordsAt.
func (r *Run) AppendAt(rec *Record) (int64, error) {
	if rec == nil {
		return 0, errors.New("append record: nil record")
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return 0, ErrClosed
	}
	if rec.Schema == "" {
		rec.Schema = Version
	}
	if rec.Schema != Version {
		return 0, fmt.Errorf("append record %q: %w %q: leave Schema empty or set it to %q", rec.RolloutID, ErrSchemaVersion, rec.Schema, Version)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		if where := nonFinite(rec); where != "" {
			err = fmt.Errorf("%s is not a finite number, which JSON cannot hold: %w", where, err)
		}
		return 0, fmt.Errorf("append record %q: %w", rec.RolloutID, err)
	}
	if len(line)+1 > MaxRecordBytes {
		return 0, fmt.Errorf("append record %q: %w: %d bytes, limit %d", rec.RolloutID, ErrRecordTooLarge, len(line)+1, MaxRecordBytes)
	}
	line = append(line, '\n')
	off, err := r.commitLine(line)
	if err != nil {
		return 0, fmt.Errorf("append record %q: %w", rec.RolloutID, err)
	}
	return off, nil
}

// A commitGroup is the records that commit together: it takes lines until
// its leader, the Append that opened it, starts the commit.
type commitGroup struct {
	lines []byte        // whole lines, in arrival order
	base  int64         // where lines landed in the file, once committed
	after *commitGroup  // the group before this one; nil for the first
	done  chan struct{} // closed when the commit has ended; err is set then
	err   error
}

// commitLine adds line to the open group and returns when that group's
// commit has ended. The Append that opens a group leads it: it waits for
// the previous group's commit, closes the group to new lines and commits
// them all; the others wait for it. So commits run one at a time, a group
// never waits behind more than one commit, and no goroutine outlives its
// Append.
func (r *Run) commitLine(line []byte) (int64, error) {
	r.commitMu.Lock()
	g := r.open
	lead := g == nil
	var at int64 // line's place in the group
	if lead {
		// line is ours (Append marshaled it), so the group may grow it.
		g = &commitGroup{lines: line, after: r.last, done: make(chan struct{})}
		r.open, r.last = g, g
	} else {
		at = int64(len(g.lines))
		g.lines = append(g.lines, line...)
	}
	r.commitMu.Unlock()
	if h := r.hooks.joined; h != nil {
		h(lead)
	}
	if !lead {
		<-g.done
		return g.base + at, g.err
	}
	if g.after != nil {
		<-g.after.done
		g.after = nil // let the chain be collected
	}
	r.commitMu.Lock()
	r.open = nil // later lines go to the next group, which commits after this one
	r.commitMu.Unlock()
	g.base = r.size
	g.err = r.commit(g.lines)
	close(g.done)
	return g.base, g.err
}

// commit makes the stored content durable, then writes lines to the end
// of rollouts.jsonl and syncs it. Only one commit runs at a time.
func (r *Run) commit(lines []byte) error {
	// The content first: a record on disk must never refer to a file that
	// a power loss could take away. Every Append of this group started
	// after its PutMessages returned, so the set holds its content or a
	// finished commit synced it.
	if err := r.syncContent(); err != nil {
		return err
	}
	if r.cutTail {
		if err := r.f.Truncate(r.size); err != nil {
			return fmt.Errorf("cut a failed append: %w", err)
		}
		r.cutTail = false
	}
	// One write of all the lines: with O_APPEND they land at the end in one
	// piece, so a crash leaves whole lines and at most a torn last one.
	n, err := r.f.Write(lines)
	if err == nil {
		err = r.f.Sync()
	}
	if err != nil {
		// Cut what may have reached the file so a failed Append leaves no
		// record behind; if that fails too, the next commit retries it.
		r.cutTail = true
		if terr := r.f.Truncate(r.size); terr == nil {
			r.cutTail = false
		}
		return err
	}
	r.size += int64(n)
	if h := r.hooks.synced; h != nil {
		h(r.f.Name())
	}
	if h := r.hooks.committed; h != nil {
		h(lines)
	}
	return nil
}

// hooks let tests watch commits; nil fields are skipped. They are set
// before the Run is shared and never change.
type hooks struct {
	joined func(lead bool)   // an Append added its line to a group
	synced func(path string) // an fsync of path succeeded (concurrently for content files)
	// packSynced says, after synced, that the fsync of a pack covered its
	// bytes before size.
	packSynced func(path string, size int64)
	committed  func(lines []byte) // lines are durable; their Appends return next
	// summaryWrite fails a summary's atomic write when it returns an
	// error, as a full disk does.
	summaryWrite hookErr
	// syncFile fails the fsync of a content file (a pack, an image) when
	// it returns an error.
	syncFile hookPathErr
}

// hookPathErr is a test hook on a path that may return an error; nil does
// nothing.
type hookPathErr func(path string) error

func (h hookPathErr) run(path string) error {
	if h == nil {
		return nil
	}
	return h(path)
}

// hookErr is a test hook that may return an error; nil does nothing.
type hookErr func() error

func (h hookErr) run() error {
	if h == nil {
		return nil
	}
	return h()
}

// A storedObject is a content file that PutMessages renamed into place.
type storedObject struct {
	known *sync.Map // r.msgs, r.imgs or r.toks
	sum   [32]byte
}

// markUnsynced records that path holds new content for the next commit to
// sync. It is called before the object is marked known, so a caller that
// finds the object known also finds it here or synced by a commit that
// has ended.
func (r *Run) markUnsynced(path string, obj storedObject) {
	r.unsyncedMu.Lock()
	defer r.unsyncedMu.Unlock()
	if r.unsynced == nil {
		r.unsynced = make(map[string]storedObject)
	}
	r.unsynced[path] = obj
}

// syncParallel bounds the fsyncs of one commit in flight together: on
// journaling file systems concurrent fsyncs share journal commits.
const syncParallel = 16

// syncContent makes the content stored since the last commit durable:
// the packs appended to and the loose files (images) written, each once and
// in parallel, then the directories that gained names (a new pack, new
// files), so that the objects and their names survive a power loss.
func (r *Run) syncContent() error {
	r.unsyncedMu.Lock()
	objs := r.unsynced
	r.unsynced = nil
	r.unsyncedMu.Unlock()
	packs := []packSync{r.msgPack.take(), r.tokPack.take()}

	var (
		mu     sync.Mutex
		failed []string
		g      errgroup.Group
	)
	g.SetLimit(syncParallel)
	dirs := make(map[string]bool, 4)
	syncOne := func(path string, f *os.File, packSize int64) error {
		err := r.hooks.syncFile.run(path)
		switch {
		case err != nil:
		case f == nil: // a loose file
			err = syncFile(path)
		default:
			err = syncPack(f)
		}
		if err != nil {
			mu.Lock()
			failed = append(failed, path)
			mu.Unlock()
			return err
		}
		if h := r.hooks.synced; h != nil {
			h(path)
		}
		if h := r.hooks.packSynced; h != nil && f != nil {
			h(path, packSize)
		}
		return nil
	}
	for path := range objs {
		dirs[filepath.Dir(path)] = true
		g.Go(func() error { return syncOne(path, nil, 0) })
	}
	for _, ps := range packs {
		if ps.f == nil {
			continue
		}
		if ps.newFile {
			dirs[ps.p.dir] = true
		}
		g.Go(func() error { return syncOne(ps.f.Name(), ps.f, ps.size) })
	}
	err := g.Wait()
	if err == nil {
		for dir := range dirs {
			if err = syncDir(dir); err != nil {
				break
			}
			if h := r.hooks.synced; h != nil {
				h(dir)
			}
		}
	}
	if err != nil {
		// Keep every file for the next commit. A file whose fsync failed
		// is also forgotten, so that the next PutMessages of its content
		// writes it again: after a failed fsync the kernel may have dropped
		// its dirty pages and a second fsync may succeed without them. So
		// are the objects appended to a pack since its last sync.
		for _, path := range failed {
			if obj, ok := objs[path]; ok {
				obj.known.Delete(obj.sum)
			}
		}
		for _, ps := range packs {
			if ps.f != nil {
				ps.p.failed(ps, slices.Contains(failed, ps.f.Name()))
			}
		}
		r.unsyncedMu.Lock()
		for path, obj := range r.unsynced {
			objs[path] = obj
		}
		r.unsynced = objs
		r.unsyncedMu.Unlock()
		return fmt.Errorf("sync stored content: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
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
	path := filepath.Join(r.dir, SummaryFile)
	err = r.hooks.summaryWrite.run()
	if err == nil {
		_, err = writeAtomic(path, tempPrefix, true, writeBytes(b))
	}
	if err != nil && s.Final {
		// On a full disk the temp file gets no blocks, and a batch that
		// stopped for that reason would leave summary.json saying
		// "running". Truncating the old file frees its blocks for the new
		// one; a crash midway leaves a truncated summary, which is no
		// worse than a lying one.
		if ierr := rewriteInPlace(path, b, s); ierr == nil {
			return fmt.Errorf("write summary: %w (rewrote it in place)", err)
		}
	}
	if err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// rewriteInPlace writes data over the file path; when that fails, it writes
// the few bytes that say how the batch ended, which fit in the blocks the
// truncation freed.
func rewriteInPlace(path string, data []byte, s *Summary) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err = f.Write(data); err != nil {
		short, _ := json.Marshal(Summary{Schema: s.Schema, Policy: s.Policy, Final: true, State: s.State, StopReason: s.StopReason})
		if err = f.Truncate(0); err == nil {
			_, err = f.WriteAt(append(short, '\n'), 0)
		}
	}
	if err == nil {
		err = f.Sync()
	}
	return err
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
