package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"legato/rl/internal/safeopen"
)

// A kept state is a guest's whole state written to a directory of its own
// on disk, to be brought back later (an attempt's end state, graded again
// with a changed evaluator). Unlike a Template it holds the guest RAM
// inside QEMU's migration stream: a clone maps its RAM privately, so QEMU
// sends it whatever x-ignore-shared says, and one format serves the VM
// and its clones. Zero pages take a few bytes each in the stream and zstd
// packs the rest, so a kept state takes about what the guest's used RAM
// compresses to, plus the disk's changes as a qcow2 layer over the base
// image (whose volume name holds its content hash: a changed image is
// another file, never the one a layer was written over).

// Files of a kept state's directory.
const (
	keptManifest = "manifest.json"
	keptStream   = "state.zst"
	keptDisk     = "disk.qcow2"
)

// keptBandwidth lifts QEMU's migration bandwidth limit while a kept state
// is written: the guest is paused anyway.
const keptBandwidth = 1 << 40

// keptManifestV is a kept state's manifest.
type keptManifestV struct {
	// Argv is libvirt's command line of the QEMU that ran the guest (a
	// clone's: its template's): a QEMU that loads the state must have the
	// same devices.
	Argv []string `json:"argv"`
	// QEMU is the binary's size and modification time: a QEMU upgraded in
	// place under the same path may not load the stream.
	QEMU fileID `json:"qemu"`
	// Base is the disk layer's backing file, the base image's volume.
	Base string `json:"base"`
	// RAMBytes is the guest RAM's size.
	RAMBytes int64 `json:"ram_bytes"`
	// StreamSHA256 is the migration stream's hash, before compression.
	StreamSHA256 string    `json:"stream_sha256"`
	StreamBytes  int64     `json:"stream_bytes"`
	Kept         time.Time `json:"kept"`
}

// fileID tells a file from another at the same path.
type fileID struct {
	Size  int64     `json:"size"`
	MTime time.Time `json:"mtime"`
}

func statID(path string) (fileID, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	return fileID{Size: st.Size(), MTime: st.ModTime().UTC()}, nil
}

// KeptStats says what keeping a state took.
type KeptStats struct {
	// Paused is how long the guest was stopped; Stream the migration
	// stream's share of it, Disk the disk layer's.
	Paused, Stream, Disk time.Duration
	// StreamBytes is the migration stream's size before compression;
	// Bytes what the directory takes on disk.
	StreamBytes, Bytes int64
}

// keepSource is what keeping a state needs of a running QEMU.
type keepSource struct {
	what     string // "VM x" or "clone y", for errors
	mon      func(ctx context.Context, cmd string, args, out any) error
	argv     []string
	overlay  string // the qcow2 the guest writes
	base     string // the base image's volume at the bottom of its chain
	ramBytes int64
}

// Keep writes the VM's whole state (guest RAM, devices, disk) to dir, which
// must not exist; the guest is paused meanwhile and runs on after. Like
// Template it needs root and a VM on this machine started with
// Config.Fork (it reads libvirt's command line of the QEMU).
func (v *VM) Keep(ctx context.Context, dir string) (KeptStats, error) {
	ctx, cancel, err := v.opCtx(ctx)
	if err != nil {
		return KeptStats{}, err
	}
	defer cancel()
	if !v.Forkable() {
		return KeptStats{}, v.fail("keep state", fmt.Errorf("%w: keeping a VM's state needs root, a VM on this machine and Config.Fork", ErrNotForkable))
	}
	p, err := findQEMU(v.name)
	if err != nil {
		return KeptStats{}, v.fail("keep state", err)
	}
	dom, err := v.domain(ctx)
	if err != nil {
		return KeptStats{}, v.fail("keep state", err)
	}
	st, err := keep(ctx, keepSource{
		what: "VM " + v.name,
		mon: func(ctx context.Context, cmd string, args, out any) error {
			return v.monitorQMP(ctx, dom, cmd, args, out)
		},
		argv: p.argv, overlay: v.overlay, base: v.images[RoleBase], ramBytes: int64(v.cfg.MemoryMiB) << 20,
	}, dir)
	if err != nil {
		return st, v.fail("keep state", err)
	}
	return st, nil
}

// Keep writes the clone's whole state to dir, as VM.Keep does.
func (c *Clone) Keep(ctx context.Context, dir string) (KeptStats, error) {
	t := c.t
	if t.base == "" {
		return KeptStats{}, fmt.Errorf("%w: clone %s: its template does not say its base image", ErrNotForkable, c.name)
	}
	return keep(ctx, keepSource{
		what: "clone " + c.name,
		mon:  func(ctx context.Context, cmd string, args, out any) error { return c.mon.run(ctx, cmd, args, out) },
		argv: t.argv, overlay: filepath.Join(c.dir, "disk.qcow2"), base: t.base, ramBytes: t.ramBytes,
	}, dir)
}

// keep pauses src's guest, writes its state to dir (made under a temporary
// name and renamed when complete: a dir that exists is whole), and lets
// the guest run again, also on an error.
func keep(ctx context.Context, src keepSource, dir string) (st KeptStats, err error) {
	if _, err := os.Lstat(dir); err == nil {
		return st, fmt.Errorf("keep state: %s exists", dir)
	}
	tmp, lock, err := newKeptDir(dir)
	if err != nil {
		return st, fmt.Errorf("keep state: %w", err)
	}
	renamed := false
	defer func() {
		if err != nil {
			// Also once renamed: the guest did not run on after it (cont
			// failed), and the caller, given an error, records no state
			// that a bound would ever drop.
			os.RemoveAll(tmp)
			if renamed {
				os.RemoveAll(dir)
			}
		}
		lock.Close()
	}()
	var status struct {
		Running bool `json:"running"`
	}
	if err := src.mon(ctx, "query-status", nil, &status); err != nil {
		return st, err
	}
	if !status.Running {
		return st, fmt.Errorf("%s: the guest is not running", src.what)
	}
	t0 := time.Now()
	defer func() {
		// As Template's capture: the guest runs on whatever happened.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCallTimeout)
		defer cancel()
		if err != nil {
			src.mon(rctx, "migrate_cancel", nil, nil)
			waitMigrationEnd(rctx, src.mon)
		}
		err = errors.Join(err, src.mon(rctx, "cont", nil, nil))
		st.Paused = time.Since(t0)
	}()
	if err := src.mon(ctx, "stop", nil, nil); err != nil {
		return st, err
	}
	// The whole RAM goes into the stream: x-ignore-shared off (a clone
	// loaded its template's state with it on).
	if err := setIgnoreShared(ctx, src.mon, false); err != nil {
		return st, err
	}
	if err := src.mon(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": keptBandwidth}, nil); err != nil {
		return st, err
	}
	t1 := time.Now()
	sum, n, err := sendStream(ctx, src.mon, filepath.Join(tmp, keptStream))
	if err != nil {
		return st, fmt.Errorf("%s: migration stream: %w", src.what, err)
	}
	st.Stream, st.StreamBytes = time.Since(t1), n
	t2 := time.Now()
	if err := convertLayer(ctx, src.overlay, src.base, filepath.Join(tmp, keptDisk)); err != nil {
		return st, fmt.Errorf("%s: disk layer: %w", src.what, err)
	}
	st.Disk = time.Since(t2)
	qemu, err := statID(src.argv[0])
	if err != nil {
		return st, fmt.Errorf("%s: %w", src.what, err)
	}
	m, err := json.MarshalIndent(keptManifestV{Argv: src.argv, QEMU: qemu, Base: src.base, RAMBytes: src.ramBytes,
		StreamSHA256: hex.EncodeToString(sum[:]), StreamBytes: n, Kept: time.Now().UTC()}, "", "  ")
	if err != nil {
		return st, err
	}
	if err := os.WriteFile(filepath.Join(tmp, keptManifest), m, 0o600); err != nil {
		return st, err
	}
	if err := syncDir(tmp); err != nil {
		return st, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return st, fmt.Errorf("keep state: %w", err)
	}
	renamed = true
	// The state is whole now: a failed count must not lose it (the
	// caller would not record it), so the stream's size stands in.
	if st.Bytes, err = DiskUsage(dir); err != nil {
		st.Bytes = n
	}
	return st, nil
}

// keptNewPrefix names a kept state's directory while it is written,
// keptMakePrefix while it is made and locked.
const (
	keptNewPrefix  = ".new-"
	keptMakePrefix = ".mk-"
)

// newKeptDir makes the directory a kept state is written in, named
// keptNewPrefix and dir's name, locked while this process writes it:
// SweepKept removes one whose writer died. It is made under another name,
// locked, then renamed, so a sweep never sees it unlocked.
func newKeptDir(dir string) (string, *os.File, error) {
	parent, name := filepath.Dir(dir), filepath.Base(dir)
	mk := filepath.Join(parent, keptMakePrefix+name)
	tmp := filepath.Join(parent, keptNewPrefix+name)
	if err := os.Mkdir(mk, 0o700); err != nil {
		return "", nil, err
	}
	lock, err := lockDir(mk)
	if err == nil {
		if err = os.Rename(mk, tmp); err != nil {
			lock.Close()
		}
	}
	if err != nil {
		os.RemoveAll(mk)
		return "", nil, err
	}
	return tmp, lock, nil
}

// SweepKept removes from dir, a directory of kept states, those whose
// writer died while it wrote them (killed, or the machine went down), and
// returns their paths. One that is being written (its lock held) stays.
func SweepKept(dir string) ([]string, error) {
	// It removes what it finds: only in a directory nobody else could
	// have led it to.
	if err := safeopen.CheckDir(dir); errors.Is(err, safeopen.ErrUnsafe) {
		return nil, fmt.Errorf("end states: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		made := strings.HasPrefix(e.Name(), keptMakePrefix)
		if !e.IsDir() || !strings.HasPrefix(e.Name(), keptNewPrefix) && !made {
			continue
		}
		path := filepath.Join(dir, e.Name())
		lock, err := openNoFollow(filepath.Join(path, "lock"), os.O_RDWR, 0)
		if err != nil {
			// Not one of ours, or not yet locked. A made one that never
			// got its lock (the writer died in between) is empty: gone
			// after a minute, which no writer takes to lock it.
			if info, ierr := e.Info(); made && errors.Is(err, fs.ErrNotExist) && ierr == nil && time.Since(info.ModTime()) > time.Minute {
				if os.Remove(path) == nil {
					removed = append(removed, path)
				}
			}
			continue
		}
		if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			lock.Close()
			continue // its writer runs
		}
		err = os.RemoveAll(path)
		lock.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}

// sendStream has the paused QEMU migrate, RAM and all, and writes what it
// sends to path compressed with zstd. It returns the stream's hash and
// size.
func sendStream(ctx context.Context, mon func(context.Context, string, any, any) error, path string) (sum [32]byte, n int64, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return sum, 0, err
	}
	defer f.Close()
	err = migrateToLoopback(ctx, mon, func(r io.Reader) error {
		bw := bufio.NewWriterSize(f, 1<<20)
		zw, err := zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return err
		}
		h := sha256.New()
		n, err = io.Copy(io.MultiWriter(zw, h), r)
		h.Sum(sum[:0])
		return errors.Join(err, zw.Close(), bw.Flush(), f.Sync())
	})
	return sum, n, err
}

// syncDir fsyncs a directory, so that the names in it are on disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// DiskUsage is what the files under dir take on their file system.
func DiskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		n += diskBytes(info)
		return nil
	})
	return n, err
}

// LoadKept makes a Template of the state kept in dir, to fork a clone in
// that state on this VM's machine: the clone loads the whole stream into
// anonymous RAM of its own. The state must have
// been kept over the base image this VM boots from, and with the same QEMU.
// Close the template when done.
func (v *VM) LoadKept(ctx context.Context, dir string) (*Template, error) {
	if !v.Forkable() {
		return nil, fmt.Errorf("%w: bringing a kept state back needs root, a VM on this machine and Config.Fork", ErrNotForkable)
	}
	b, err := readKept(dir, keptManifest)
	if err != nil {
		return nil, fmt.Errorf("kept state %s: %w", dir, err)
	}
	var m keptManifestV
	if err := json.Unmarshal(b, &m); err != nil || len(m.Argv) == 0 || m.RAMBytes <= 0 {
		return nil, fmt.Errorf("kept state %s: its manifest does not parse (%v): the state was not written whole; drop it", dir, err)
	}
	if base := v.images[RoleBase]; m.Base != base {
		return nil, fmt.Errorf("kept state %s was written over the base image %s; this VM boots %s: grade it with the image it was collected on", dir, m.Base, base)
	}
	p, err := findQEMU(v.name)
	if err != nil {
		return nil, err
	}
	if m.Argv[0] != p.argv[0] {
		return nil, fmt.Errorf("kept state %s was written by %s; this VM runs %s: grade it with the QEMU that kept it", dir, m.Argv[0], p.argv[0])
	}
	if id, err := statID(p.argv[0]); err != nil || !id.MTime.Equal(m.QEMU.MTime) || id.Size != m.QEMU.Size {
		return nil, fmt.Errorf("kept state %s was written by another build of %s (then %d bytes, %v; now %+v, %v): QEMU may not load it; grade it with the QEMU that kept it",
			dir, p.argv[0], m.QEMU.Size, m.QEMU.MTime, id, err)
	}
	stream, err := openKept(dir, keptStream)
	if err != nil {
		return nil, fmt.Errorf("kept state %s: %w", dir, err)
	}
	stream.Close()
	p.argv = slices.Clone(m.Argv)
	t, err := newTemplate(v.cfg, p)
	if err != nil {
		return nil, err
	}
	t.base, t.ramBytes, t.kept, t.keptSum = m.Base, m.RAMBytes, dir, m.StreamSHA256
	if err := t.loadKeptFiles(ctx, dir); err != nil {
		t.Close()
		return nil, fmt.Errorf("kept state %s: %w", dir, err)
	}
	return t, nil
}

// openKept opens the file name of the kept state dir. A kept state lies
// in a run directory, which need not be root's: the file is opened without
// following a symlink or blocking on a FIFO, through directories nobody
// else can change (see package safeopen).
func openKept(dir, name string) (*os.File, error) {
	return safeopen.Open(filepath.Join(dir, name))
}

// readKept reads the file name of the kept state dir, as openKept opens
// it.
func readKept(dir, name string) ([]byte, error) {
	return safeopen.ReadFile(filepath.Join(dir, name))
}

// loadKeptFiles gives a template of a kept state its disk layer, copied:
// QEMU's user reads it, and each clone's overlay is backed by it. Its
// clones' RAM is anonymous, filled by the stream; they map no file.
func (t *Template) loadKeptFiles(ctx context.Context, dir string) error {
	src, err := openKept(dir, keptDisk)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := openNoFollow(t.diskPath(), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, readerCtx{ctx, src})
	if err == nil {
		err = dst.Chown(-1, t.gid)
	}
	return errors.Join(err, dst.Close())
}

// openState opens the state a clone loads: the device state in memory, or
// a kept state's whole stream.
func (t *Template) openState() (io.ReadCloser, error) {
	if t.kept == "" {
		return io.NopCloser(bytes.NewReader(t.state)), nil
	}
	f, err := openKept(t.kept, keptStream)
	if err != nil {
		return nil, err
	}
	zr, err := zstd.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		f.Close()
		return nil, err
	}
	return &keptReader{zr: zr, f: f, h: sha256.New(), want: t.keptSum}, nil
}

// keptReader reads a kept state's stream, and fails at its end when the
// stream's hash is not the manifest's: a changed file must not give a
// clone (and a grade) of another state.
type keptReader struct {
	zr   *zstd.Decoder
	f    *os.File
	h    hash.Hash
	want string
}

func (k *keptReader) Read(p []byte) (int, error) {
	n, err := k.zr.Read(p)
	k.h.Write(p[:n])
	if err == io.EOF {
		if got := hex.EncodeToString(k.h.Sum(nil)); got != k.want {
			return n, fmt.Errorf("kept state stream %s: its hash is %s, the manifest says %s: the file changed since it was kept", k.f.Name(), got, k.want)
		}
	}
	return n, err
}

func (k *keptReader) Close() error {
	k.zr.Close()
	return k.f.Close()
}

// readerCtx stops a copy when ctx ends.
type readerCtx struct {
	ctx context.Context
	r   io.Reader
}

func (r readerCtx) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// diskBytes is what a file takes on its file system (its blocks), its
// length where the system does not say.
func diskBytes(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
