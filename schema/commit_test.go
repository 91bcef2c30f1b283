package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// syncLog watches a Run's commits through its hooks. It checks, as each
// group commits, that every message and image its records refer to was
// fsynced, file and directory, before the record was written.
type syncLog struct {
	t   *testing.T
	dir string

	mu        sync.Mutex
	events    []string         // "sync <name relative to dir>" and "commit <ids>", in order
	syncs     map[string]int   // name relative to dir → fsyncs
	packUpTo  map[string]int64 // pack relative to dir → bytes a sync covered
	commits   int              // fsyncs of rollouts.jsonl
	committed map[string]bool
	joins     int
	// afterCommit, if set, runs after a commit is logged and before its
	// Appends return, outside the lock.
	afterCommit func(n int)
	joined      func(n int) // like afterCommit, after each join
}

func watch(t *testing.T, r *Run) *syncLog {
	l := &syncLog{t: t, dir: r.Dir(), syncs: map[string]int{}, packUpTo: map[string]int64{}, committed: map[string]bool{}}
	r.hooks = hooks{joined: l.join, synced: l.synced, packSynced: l.packSynced, committed: l.commit}
	return l
}

func (l *syncLog) join(lead bool) {
	l.mu.Lock()
	l.joins++
	n, f := l.joins, l.joined
	l.mu.Unlock()
	if f != nil {
		f(n)
	}
}

// rel names path relative to the run; ok is false (and the test fails)
// for a path outside it.
func (l *syncLog) rel(path string) (string, bool) {
	rel, err := filepath.Rel(l.dir, path)
	if err != nil {
		l.t.Errorf("fsync outside the run: %v", err)
		return "", false
	}
	return rel, true
}

func (l *syncLog) synced(path string) {
	rel, ok := l.rel(path)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, "sync "+rel)
	l.syncs[rel]++
	if rel == RecordsFile {
		l.commits++
	}
}

func (l *syncLog) packSynced(path string, size int64) {
	rel, ok := l.rel(path)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.packUpTo[rel] = max(l.packUpTo[rel], size)
}

func (l *syncLog) commit(lines []byte) {
	var ids []string
	for line := range bytes.Lines(lines) {
		var rec Record
		if err := json.Unmarshal(line, &rec); err != nil {
			l.t.Errorf("committed line: %v", err)
			continue
		}
		ids = append(ids, rec.RolloutID)
		for _, st := range rec.Steps {
			l.checkSynced(rec.RolloutID, st)
		}
	}
	l.mu.Lock()
	l.events = append(l.events, "commit "+strings.Join(ids, " "))
	for _, id := range ids {
		l.committed[id] = true
	}
	n, f := l.commits, l.afterCommit
	l.mu.Unlock()
	if f != nil {
		f(n)
	}
}

// checkSynced reports the content of step that was not fsynced before its
// record was committed.
func (l *syncLog) checkSynced(id string, st Step) {
	msgs, err := LoadRequest(l.dir, st, LoadOptions{KeepImageRefs: true})
	if err != nil {
		l.t.Errorf("record %s committed with a prompt that does not load: %v", id, err)
		return
	}
	// Messages and token chunks are packed: the pack must have been
	// synced past their entries, and its name into the directory.
	type packed struct{ dir, hash string } // dir: messages/ or tokens/
	var need []string
	var inPacks []packed
	for _, sub := range []string{MessagesDir, TokensDir} {
		hashes := st.Request
		if sub == TokensDir {
			hashes = st.PromptTokenChunks
		}
		if len(hashes) == 0 {
			continue
		}
		need = append(need, sub)
		for _, h := range hashes {
			inPacks = append(inPacks, packed{sub, h})
		}
	}
	for i := range st.Request {
		for _, p := range msgs[i].Content {
			if p.ImageURL != nil {
				need = append(need, ImagesDir, filepath.Join(ImagesDir, strings.TrimPrefix(p.ImageURL.URL, ImageScheme)+".png"))
			}
		}
	}
	// Where each object's entry ends, in which pack (relative to the run).
	type entryEnd struct {
		pack string
		end  int64
	}
	ends := map[packed]entryEnd{}
	entries := map[string]map[string][]packedEntry{}
	for _, p := range inPacks {
		if entries[p.dir] == nil {
			entries[p.dir] = packEntries(l.t, filepath.Join(l.dir, p.dir))
		}
		es := entries[p.dir][p.hash]
		if len(es) == 0 {
			l.t.Errorf("record %s refers to %s/%s, which no pack holds", id, p.dir, p.hash)
			continue
		}
		// The first entry: the one put before the record's Append.
		ends[p] = entryEnd{filepath.Join(p.dir, es[0].pack), es[0].off + int64(len(es[0].data))}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range need {
		if l.syncs[name] == 0 {
			l.t.Errorf("record %s committed before %s was fsynced", id, name)
		}
	}
	for p, e := range ends {
		if l.packUpTo[e.pack] < e.end {
			l.t.Errorf("record %s committed before %s/%s was fsynced (%s synced up to byte %d, the entry ends at %d)",
				id, p.dir, p.hash, e.pack, l.packUpTo[e.pack], e.end)
		}
	}
}

func (l *syncLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events
	l.events = nil
	return ev
}

func (l *syncLog) isCommitted(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.committed[id]
}

// inSyncOrder sorts each run of consecutive fsyncs of the same kind
// (content files, directories), whose order is not defined: files are
// synced in parallel, directories in map order.
func inSyncOrder(ev []string) []string {
	kind := func(e string) string {
		name, ok := strings.CutPrefix(e, "sync ")
		switch {
		case !ok:
			return e
		case strings.Contains(name, string(filepath.Separator)):
			return "file"
		case name == MessagesDir || name == ImagesDir:
			return "dir"
		}
		return e
	}
	ev = slices.Clone(ev)
	for i := 0; i < len(ev); {
		j := i + 1
		for j < len(ev) && kind(ev[j]) == kind(ev[i]) {
			j++
		}
		slices.Sort(ev[i:j])
		i = j
	}
	return ev
}

// TestPutMessagesDefersSync: PutMessages syncs nothing; the next Append
// syncs the new files, then their directories, then the record, and stored
// content is synced once.
func TestPutMessagesDefersSync(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	l := watch(t, r)
	img := withTextChunk(tinyPNG, "defer")
	msgs := []Message{
		{Role: "system", Content: []Part{TextPart("sys")}},
		{Role: "user", Content: []Part{TextPart("look"), ImagePart(dataURL(img))}},
	}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if ev := l.take(); len(ev) != 0 {
		t.Errorf("PutMessages synced: %q, want no fsync on the step path", ev)
	}
	rec := fullRecord("a")
	rec.Steps = rec.Steps[:1]
	rec.Steps[0].Request = hashes
	if err := r.Append(rec); err != nil {
		t.Fatal(err)
	}
	want := inSyncOrder([]string{
		"sync " + filepath.Join(ImagesDir, sha(img)+".png"),
		"sync " + filepath.Join(MessagesDir, "pack-1"),
		"sync " + ImagesDir, "sync " + MessagesDir,
		"sync " + RecordsFile, "commit a",
	})
	if diff := cmp.Diff(want, inSyncOrder(l.take())); diff != "" {
		t.Errorf("first Append (-want +got):\n%s", diff)
	}

	// Stored content is not synced again.
	if _, err := r.PutMessages(msgs); err != nil {
		t.Fatal(err)
	}
	rec.RolloutID = "b"
	if err := r.Append(rec); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"sync " + RecordsFile, "commit b"}, l.take()); diff != "" {
		t.Errorf("second Append (-want +got):\n%s", diff)
	}

	// Close syncs content that no record refers to yet.
	more, err := r.PutMessages([]Message{{Role: "assistant", Content: []Part{TextPart("done")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// In the same pack, whose name is synced already.
	if objectFile(t, filepath.Join(dir, MessagesDir), more[0]) != "pack-1" {
		t.Errorf("a message put after the first commit is not in pack-1")
	}
	want = []string{"sync " + filepath.Join(MessagesDir, "pack-1")}
	if diff := cmp.Diff(want, l.take()); diff != "" {
		t.Errorf("Close (-want +got):\n%s", diff)
	}
}

// TestAppendGroupCommit holds the first commit until every other Append
// has queued: they all commit in the next group, with one fsync of
// rollouts.jsonl, and each Append returns only after its line was synced.
func TestAppendGroupCommit(t *testing.T) {
	const appends = 16
	dir := t.TempDir()
	r := mustCreate(t, dir)
	l := watch(t, r)
	allJoined := make(chan struct{})
	l.joined = func(n int) {
		if n == appends {
			close(allJoined)
		}
	}
	l.afterCommit = func(n int) {
		if n == 1 {
			<-allJoined
		}
	}
	runAppends(t, r, l, appends, 1)
	l.mu.Lock()
	commits := l.commits
	l.mu.Unlock()
	// The first group holds the Appends that joined before its leader
	// started, the second all the others.
	if commits > 2 {
		t.Errorf("%d records took %d fsyncs of %s, want at most 2", appends, commits, RecordsFile)
	}
	if _, st := readAll(t, dir); st.Records != appends || st.TornLines != 0 {
		t.Errorf("stats %+v, want %d records and no torn line", st, appends)
	}
}

// TestAppendConcurrentSyncs runs workers that store a step and append its
// record, as a batch does: each content file is synced exactly once, before
// any record that refers to it, and each Append returns after its commit.
func TestAppendConcurrentSyncs(t *testing.T) {
	const workers, each = 8, 6
	dir := t.TempDir()
	r := mustCreate(t, dir)
	l := watch(t, r)
	runAppends(t, r, l, workers, each)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	packs := map[string]bool{filepath.Join(MessagesDir, "pack-1"): true, filepath.Join(TokensDir, "pack-1"): true}
	for name, n := range l.syncs {
		if n != 1 && name != RecordsFile && name != MessagesDir && name != ImagesDir && name != TokensDir && !packs[name] {
			t.Errorf("%s fsynced %d times, want once", name, n)
		}
	}
	// Per record an image; the two packs; and the four names of the run
	// directory.
	if got, want := len(l.syncs), workers*each+2+4; got != want {
		t.Errorf("%d names fsynced, want %d", got, want)
	}
	// Every worker's system message and the first prompt token chunk they
	// share, plus per record a message and a last chunk, each packed once.
	for _, sub := range []string{MessagesDir, TokensDir} {
		for h, es := range packEntries(t, filepath.Join(dir, sub)) {
			if len(es) != 1 {
				t.Errorf("%s/%s packed %d times, want once", sub, h, len(es))
			}
		}
		if got, want := len(objectHashes(t, filepath.Join(dir, sub))), 1+workers*each; got != want {
			t.Errorf("%s: %d objects, want %d", sub, got, want)
		}
	}
	t.Logf("%d records, %d fsyncs of %s", workers*each, l.commits, RecordsFile)
	if l.commits > workers*each {
		t.Errorf("%d fsyncs of %s for %d records", l.commits, RecordsFile, workers*each)
	}
}

// runAppends runs workers goroutines that each store a prompt with a new
// screenshot and append a record referring to it, each times, and checks
// that every Append returns only after its record was committed.
func runAppends(t *testing.T, r *Run, l *syncLog, workers, each int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				hashes, err := r.PutMessages([]Message{
					{Role: "system", Content: []Part{TextPart("sys")}},
					{Role: "user", Content: []Part{TextPart(id), ImagePart(dataURL(withTextChunk(tinyPNG, id)))}},
				})
				if err != nil {
					t.Error(err)
					return
				}
				// A prompt of one chunk every record shares and a last
				// chunk of its own.
				ids := make([]int64, TokenChunk+1)
				ids[TokenChunk] = int64(w*each + i)
				chunks, err := r.PutTokenIDs(ids)
				if err != nil {
					t.Error(err)
					return
				}
				rec := fullRecord(id)
				rec.Steps = rec.Steps[:1]
				rec.Steps[0].Request = hashes
				rec.Steps[0].PromptTokenChunks = chunks
				if err := r.Append(rec); err != nil {
					t.Error(err)
					return
				}
				if !l.isCommitted(id) {
					t.Errorf("Append of %s returned before a sync covered it", id)
				}
			}
		})
	}
	wg.Wait()
}

// TestAppendContentSyncFails: when content cannot be synced the record is
// not written, and the content is written again by the next PutMessages
// rather than trusted.
func TestAppendContentSyncFails(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	msgs := []Message{{Role: "user", Content: []Part{TextPart("lost"), ImagePart(dataURL(withTextChunk(tinyPNG, "lost")))}}}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	// The fsync of the messages' pack fails, as on a failing disk.
	failing := true
	r.hooks.syncFile = func(path string) error {
		if failing && filepath.Dir(path) == filepath.Join(dir, MessagesDir) {
			return errors.New("input/output error")
		}
		return nil
	}
	rec := fullRecord("a")
	rec.Steps = rec.Steps[:1]
	rec.Steps[0].Request = hashes
	if err := r.Append(rec); err == nil || !strings.Contains(err.Error(), "sync stored content") {
		t.Fatalf("Append with unsyncable content: %v, want a sync error", err)
	}
	if _, st := readAll(t, dir); st.Lines != 0 {
		t.Fatalf("a failed Append left %d lines", st.Lines)
	}
	failing = false
	again, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(hashes, again); diff != "" {
		t.Errorf("hashes (-want +got):\n%s", diff)
	}
	// Written again rather than trusted.
	if es := packEntries(t, filepath.Join(dir, MessagesDir))[hashes[0]]; len(es) != 2 {
		t.Errorf("message packed %d times after a failed sync, want 2", len(es))
	}
	if err := r.Append(rec); err != nil {
		t.Fatalf("Append after the content was stored again: %v", err)
	}
	got, err := LoadRequest(dir, rec.Steps[0], LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(msgs, got); diff != "" {
		t.Errorf("prompt (-want +got):\n%s", diff)
	}
}

// TestAppendAtOffsets: the offset AppendAt returns is where its record's
// line starts, for records that committed together in one write too.
func TestAppendAtOffsets(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	const n = 24
	offs := make([]int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			off, err := r.AppendAt(&Record{RolloutID: fmt.Sprintf("r%d", i), Status: StatusOK, Steps: make([]Step, i%3)})
			if err != nil {
				t.Error(err)
			}
			offs[i] = off
		})
	}
	wg.Wait()
	recs, err := ReadRecordsAt(dir, offs)
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range recs {
		if want := fmt.Sprintf("r%d", i); rec.RolloutID != want {
			t.Errorf("record at %d is %s, want %s", offs[i], rec.RolloutID, want)
		}
	}
	if _, err := ReadRecordsAt(dir, []int64{offs[0] + 1}); err == nil {
		t.Error("reading from the middle of a line found a record")
	}
}

// TestReadRunRecordsFrom: reading from a record's offset passes that record
// and those after it with their offsets in the file, and a torn tail's
// offset is the file's too.
func TestReadRunRecordsFrom(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	var offs []int64
	for i := range 5 {
		off, err := r.AppendAt(&Record{RolloutID: fmt.Sprintf("r%d", i), Status: StatusOK})
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	f.WriteString(`{"schema":"legato.rollout/v0","rollout_id":"torn"`)
	f.Close()
	var got []string
	st, err := ReadRunRecordsFrom(dir, offs[3], func(rec Record, line int, off int64) error {
		got = append(got, fmt.Sprintf("%s@%d line %d", rec.RolloutID, off, line))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("r3@%d line 1", offs[3]), fmt.Sprintf("r4@%d line 2", offs[4])}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if !st.TornTail || st.TornOffset != fi.Size() || st.FirstTorn.Offset != fi.Size() {
		t.Errorf("torn tail at %d (first torn %+v), want at %d", st.TornOffset, st.FirstTorn, fi.Size())
	}
}
