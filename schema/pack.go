package schema

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Small objects (messages, token chunks: a few hundred bytes each) are
// appended to pack files instead of each taking a file: a file costs a
// 4 KiB block and an inode, so a run of 30,000 steps took 25 times its
// apparent size on disk, and a commit synced every new file and its
// directory where it now syncs one file per kind. Images stay one file
// each: exports hand their paths to trainers.
//
// A pack is named pack-<n> in the directory of its kind (messages/,
// tokens/); each Run opened on the directory appends to a new one. It
// starts with packMagic, then entries, one after another:
//
//	[32]byte   sha256 of the object's content (its hash, as a loose file's name)
//	uint32     length of the data, little-endian
//	data       what a loose file would hold: the zstd frame of the content
//
// A crash can leave a pack's last entry cut short; readers stop before it.
// An entry is not trusted by its header alone: readers check the content
// against the hash, as for loose files. Loose files (runs written before
// packs) are still read.
const (
	packMagic  = "LGPACK1\n"
	packPrefix = "pack-"
	packHeader = 32 + 4
	// packMaxEntry bounds one entry's data, as MaxRecordBytes bounds a
	// record: a damaged length must not make a reader allocate gigabytes.
	packMaxEntry = MaxRecordBytes
)

// packWriter appends objects of one kind to the Run's pack in dir, created
// at the first put. It is safe for concurrent use.
type packWriter struct {
	dir   string
	known *sync.Map // the Run's set of stored hashes of this kind

	mu       sync.Mutex
	f        *os.File
	size     int64
	unsynced [][32]byte // appended since the last successful sync
	newFile  bool       // the pack's name is not synced into dir yet
}

// put appends data, the stored form of the object whose content hashes to
// sum. The entry is whole in the file (for readers in this process) once
// put returns, durable after the next sync.
func (p *packWriter) put(sum [32]byte, data []byte) error {
	if len(data) > packMaxEntry {
		return fmt.Errorf("%d bytes, more than a pack entry holds (%d)", len(data), packMaxEntry)
	}
	entry := make([]byte, packHeader, packHeader+len(data))
	copy(entry, sum[:])
	binary.LittleEndian.PutUint32(entry[32:], uint32(len(data)))
	entry = append(entry, data...)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil {
		if err := p.create(); err != nil {
			return err
		}
	}
	// One write: with O_APPEND the entry lands whole at the end, or the
	// failed part is cut below.
	n, err := p.f.Write(entry)
	if err != nil {
		if n > 0 {
			if terr := p.f.Truncate(p.size); terr != nil {
				// Readers stop at the cut entry; a later entry would be
				// lost behind it, so this pack takes no more.
				p.f.Close()
				p.f = nil
			}
		}
		return fmt.Errorf("append to pack in %s: %w", p.dir, err)
	}
	p.size += int64(n)
	p.unsynced = append(p.unsynced, sum)
	return nil
}

// create opens the next unused pack-<n> in dir.
func (p *packWriter) create() error {
	names, err := packNames(p.dir)
	if err != nil {
		return err
	}
	next := 1
	if len(names) > 0 {
		next = packNumber(names[len(names)-1]) + 1
	}
	f, err := os.OpenFile(filepath.Join(p.dir, packPrefix+strconv.Itoa(next)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, fileMode)
	if err != nil {
		return fmt.Errorf("create pack: %w", err)
	}
	if _, err := f.Write([]byte(packMagic)); err != nil {
		f.Close()
		return fmt.Errorf("create pack: %w", err)
	}
	p.f, p.size, p.newFile = f, int64(len(packMagic)), true
	return nil
}

// packSync is what one commit syncs of a pack: its file, nil when nothing
// was appended since the last sync, and the objects appended.
type packSync struct {
	p       *packWriter
	f       *os.File
	size    int64 // the entries before it are the ones to sync
	sums    [][32]byte
	newFile bool // the pack's name must be synced into its directory
}

// take hands the entries appended since the last sync to a commit, which
// syncs them (Run.syncContent).
func (p *packWriter) take() packSync {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := packSync{p: p, size: p.size, sums: p.unsynced, newFile: p.newFile}
	if len(ps.sums) > 0 || ps.newFile {
		ps.f = p.f
	}
	p.unsynced, p.newFile = nil, false
	return ps
}

// failed is told that a commit's sync of ps failed (fileFailed: the pack's
// own fsync). The objects appended since the last sync are forgotten by
// the Run, so that their next put writes them again: after a failed fsync
// the kernel may have dropped their pages, and a later fsync may succeed
// without them. The pack's name is synced by the next commit.
func (p *packWriter) failed(ps packSync, fileFailed bool) {
	if fileFailed {
		for _, s := range ps.sums {
			p.known.Delete(s)
		}
	}
	p.mu.Lock()
	p.newFile = p.newFile || ps.newFile
	if !fileFailed {
		// Synced, but a directory was not: sync the file again with it.
		p.unsynced = append(p.unsynced, ps.sums...)
	}
	p.mu.Unlock()
}

// syncPack fsyncs the open pack f, and fails when f is no longer the file
// its name holds (its directory was removed or replaced): what was
// appended to it is lost with it.
func syncPack(f *os.File) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	open, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	named, err := os.Stat(f.Name())
	if err != nil || !os.SameFile(open, named) {
		return fmt.Errorf("%s was removed while the run appended to it (%v): the objects in it are lost", f.Name(), err)
	}
	return nil
}

// close closes the pack file; the Run syncs it first.
func (p *packWriter) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil {
		return nil
	}
	err := p.f.Close()
	p.f = nil
	return err
}

// packNames lists the packs in dir, in the order they were written.
func packNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if packNumber(e.Name()) > 0 {
			names = append(names, e.Name())
		}
	}
	// ReadDir sorts by name; pack-10 sorts before pack-9.
	slices.SortFunc(names, func(a, b string) int { return packNumber(a) - packNumber(b) })
	return names, nil
}

// packNumber is n of a pack-<n> name, 0 for any other name.
func packNumber(name string) int {
	s, ok := strings.CutPrefix(name, packPrefix)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || strconv.Itoa(n) != s {
		return 0
	}
	return n
}

// packIndex finds objects in the packs of one directory for a reader. It
// reads the entries' headers once, and again from where it stopped when an
// object is not found, since a Run may be appending meanwhile. It is safe
// for concurrent use.
type packIndex struct {
	dir string

	mu      sync.RWMutex
	indexed bool // refresh ran once
	packs   map[string]*packFile
	locs    map[[32]byte]packLoc

	// Objects are read a window of the pack at a time: a reader goes
	// through a run about in the order it was written, and one read per
	// object (a few KB) was most of loading it. A window holds entries
	// already indexed, which a pack never changes, so a window is never
	// stale; the oldest is replaced.
	windowed bool
	wmu      sync.Mutex
	windows  [packWindows]packWindow
	nextWin  int
}

// packWindows windows of packWindowBytes each are kept per index: one or
// two per reading goroutine of an export on most machines, a few MB.
const (
	packWindows     = 8
	packWindowBytes = 256 << 10
)

type packWindow struct {
	pack *packFile
	off  int64
	data []byte
}

type packFile struct {
	f       *os.File
	scanned int64 // entries before this offset are indexed
}

type packLoc struct {
	pack *packFile
	off  int64 // of the data
	n    int
}

// newPackIndex indexes the packs of dir; windowed says whether objects
// are read through windows or one read each.
func newPackIndex(dir string, windowed bool) *packIndex {
	return &packIndex{dir: dir, packs: make(map[string]*packFile), locs: make(map[[32]byte]packLoc), windowed: windowed}
}

// get appends to dst the stored data of the object hashing to sum if the
// packs indexed so far (all of them at the first call) hold it; ok is
// false if not.
func (x *packIndex) get(sum [32]byte, dst []byte) (_ []byte, ok bool, err error) {
	loc, scanned, ok, indexed := x.lookup(sum)
	if !ok && !indexed {
		if err := x.refresh(); err != nil {
			return nil, false, err
		}
		loc, scanned, ok, _ = x.lookup(sum)
	}
	if !ok {
		return nil, false, nil
	}
	b, err := x.read(loc, scanned, dst)
	return b, true, err
}

// lookup returns where the object hashing to sum is, if indexed, with how
// far its pack is indexed (scanned); indexed reports whether refresh ran.
func (x *packIndex) lookup(sum [32]byte) (loc packLoc, scanned int64, ok, indexed bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	loc, ok = x.locs[sum]
	if ok {
		scanned = loc.pack.scanned
	}
	return loc, scanned, ok, x.indexed
}

// read appends loc's data to dst from a window of its pack, reading one
// that starts at loc when none holds it. A window ends where the pack was
// indexed to (scanned): past it, a writer may yet cut a failed entry and
// write another in its place.
//
// The data is copied out of the window, a few KB, so that no caller holds
// a window: one evicted is read into again. A new window for each read
// (256 KB) was a fifth of the memory a contiguous export allocated, and
// every allocation brings the next collection nearer.
func (x *packIndex) read(loc packLoc, scanned int64, dst []byte) ([]byte, error) {
	x.wmu.Lock()
	for _, w := range x.windows {
		if w.pack == loc.pack && w.off <= loc.off && loc.off+int64(loc.n) <= w.off+int64(len(w.data)) {
			start := loc.off - w.off
			dst = append(dst, w.data[start:start+int64(loc.n)]...)
			x.wmu.Unlock()
			return dst, nil
		}
	}
	var buf []byte
	slot := -1
	if x.windowed {
		// The oldest window leaves the set now: its memory is this
		// read's alone until it comes back with what it read.
		slot = x.nextWin
		buf = x.windows[slot].data[:0]
		x.windows[slot] = packWindow{}
		x.nextWin = (x.nextWin + 1) % packWindows
	}
	x.wmu.Unlock()
	size := loc.n
	if x.windowed {
		size = max(size, packWindowBytes)
	}
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	got, err := loc.pack.f.ReadAt(buf, loc.off)
	if got < loc.n {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return dst, fmt.Errorf("read %s: %w", loc.pack.f.Name(), err)
	}
	dst = append(dst, buf[:loc.n]...)
	if slot >= 0 {
		x.wmu.Lock()
		// A slot taken again meanwhile (as many reads missed) holds
		// the window installed last.
		x.windows[slot] = packWindow{pack: loc.pack, off: loc.off, data: buf[:min(int64(got), scanned-loc.off)]}
		x.wmu.Unlock()
	}
	return dst, nil
}

// refresh indexes the entries written since the last refresh, in packs
// already known and new ones. Where two entries hold the same object, the
// later one wins: a Run opened again writes objects anew into its own pack.
func (x *packIndex) refresh() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.indexed = true
	names, err := packNames(x.dir)
	if err != nil {
		return fmt.Errorf("list packs: %w", err)
	}
	for _, name := range names {
		p := x.packs[name]
		if p == nil {
			f, err := os.Open(filepath.Join(x.dir, name))
			if err != nil {
				return fmt.Errorf("open pack: %w", err)
			}
			p = &packFile{f: f}
			x.packs[name] = p
		}
		if err := x.scan(p); err != nil {
			return err
		}
	}
	return nil
}

// scan indexes p's whole entries after p.scanned.
func (x *packIndex) scan(p *packFile) error {
	fi, err := p.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if p.scanned == 0 {
		if size < int64(len(packMagic)) {
			return nil // being created
		}
		magic := make([]byte, len(packMagic))
		if _, err := p.f.ReadAt(magic, 0); err != nil {
			return fmt.Errorf("read %s: %w", p.f.Name(), err)
		}
		if string(magic) != packMagic {
			return fmt.Errorf("%s: %w: not a pack (it starts %q)", p.f.Name(), ErrCorrupt, magic)
		}
		p.scanned = int64(len(packMagic))
	}
	r := bufio.NewReaderSize(io.NewSectionReader(p.f, p.scanned, size-p.scanned), 64<<10)
	var head [packHeader]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return nil // the end, or an entry being written or cut short
		}
		n := int64(binary.LittleEndian.Uint32(head[32:]))
		if n > packMaxEntry || p.scanned+packHeader+n > size {
			return nil
		}
		if _, err := r.Discard(int(n)); err != nil {
			return nil
		}
		x.locs[[32]byte(head[:32])] = packLoc{pack: p, off: p.scanned + packHeader, n: int(n)}
		p.scanned += packHeader + n
	}
}

// close closes the pack files.
func (x *packIndex) close() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.packs {
		p.f.Close()
	}
	x.packs, x.locs = nil, nil
	x.wmu.Lock()
	x.windows = [packWindows]packWindow{}
	x.wmu.Unlock()
}
