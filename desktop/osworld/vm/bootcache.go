package vm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// The boot cache (Config.BootCache): a VM's clean state is kept after its
// boot, so that later VMs of the same machine on the same base image
// start from it instead of booting. A boot under software emulation takes
// 15 to 55 s; loading the kept state takes a few seconds, and on any host
// it spares the boot storm of a pool whose desktops all start at once.
//
// An entry is the first VM's overlay, copied while the guest is paused
// just after the clean snapshot (an internal snapshot with guest RAM) was
// taken in it. A later VM gets a copy of that file as its overlay, starts
// paused, loads the snapshot in place (loadvm, as a reset does) and runs:
// its clean snapshot is the first VM's, so resets bring it back to the
// same state. libvirt's record of the snapshot is written again for the
// new domain (a redefinition), so libvirt's revert works on it too.
//
// The entry's name is a hash of what a snapshot depends on besides the
// guest (see Identity): the machine's definition without name, ports and
// overlay, the base image's volume (named after its content's hash) and
// the QEMU version. A changed image or machine is another entry; an entry
// that does not load is removed and the VM boots. The entries are files of
// this machine: a VM here copies its overlay in and out as a file, one on
// a remote host through libvirt's volume download and upload. Hosts whose
// pools hold the image at the same path (same PoolDir) share entries.

// Files of a boot cache entry.
const (
	bootCacheOverlay  = "overlay.qcow2"
	bootCacheManifest = "manifest.json"
)

// bootManifest describes a boot cache entry.
type bootManifest struct {
	Machine string `json:"machine"`
	// Image is the base image's volume the overlay is a layer over: an
	// entry whose volume is gone is pruned.
	Image string `json:"image"`
	// QEMU is libvirt's number for the hypervisor's version.
	QEMU uint64 `json:"qemu_version"`
	// Caller is Config.BootCacheKey: what the caller's readiness probe
	// put in the guest before the snapshot depends on.
	Caller string `json:"caller,omitempty"`
	// Host names the host whose VM filled the entry; Local says it is
	// this machine, where Image can be looked for.
	Host  string    `json:"host"`
	Local bool      `json:"local"`
	Taken time.Time `json:"taken"`
	Bytes int64     `json:"bytes"`
}

// key is the entry's directory name.
func (m bootManifest) key() string {
	h := sha256.Sum256([]byte(m.Machine + "\n" + m.Image + "\n" + strconv.FormatUint(m.QEMU, 10) + "\n" + m.Caller))
	return hex.EncodeToString(h[:16])
}

// bootFlight is a VM of this process booting to fill an entry: the other
// VMs that want that entry wait for it rather than boot too.
type bootFlight struct{ done chan struct{} }

var bootFlights = struct {
	sync.Mutex
	m map[string]*bootFlight
}{m: map[string]*bootFlight{}}

// joinBootFlight returns the flight filling dir, and whether the caller
// just started it (and must end it with endBootFlight).
func joinBootFlight(dir string) (*bootFlight, bool) {
	bootFlights.Lock()
	defer bootFlights.Unlock()
	if f, ok := bootFlights.m[dir]; ok {
		return f, false
	}
	f := &bootFlight{done: make(chan struct{})}
	bootFlights.m[dir] = f
	return f, true
}

func endBootFlight(dir string, f *bootFlight) {
	bootFlights.Lock()
	if bootFlights.m[dir] == f {
		delete(bootFlights.m, dir)
	}
	bootFlights.Unlock()
	close(f.done)
}

// bootFill is the entry a booting VM is to fill after its clean snapshot.
type bootFill struct {
	dir    string
	m      bootManifest
	flight *bootFlight
}

// bootManifest is what v's entry would say, but its time and size.
func (v *VM) bootManifest(ctx context.Context) (bootManifest, error) {
	m, err := machineHash(v.spec())
	if err != nil {
		return bootManifest{}, err
	}
	var ver uint64
	err = v.conn.do(ctx, "hypervisor version", func(lv *libvirt.Libvirt) error {
		var err error
		ver, err = lv.ConnectGetVersion()
		return err
	})
	if err != nil {
		return bootManifest{}, err
	}
	return bootManifest{Machine: m, Image: v.images[RoleBase], QEMU: ver, Caller: v.cfg.BootCacheKey,
		Host: v.host.Name(), Local: !v.host.Remote()}, nil
}

type restoringKey struct{}

// Restoring reports whether a ReadyFunc is called for a VM that started
// from the boot cache rather than booted: the guest resumed the clean
// state another VM's probe prepared, and must not be prepared again.
func Restoring(ctx context.Context) bool {
	r, _ := ctx.Value(restoringKey{}).(bool)
	return r
}

// startFromBootCache starts v from its boot cache entry and reports true
// when it did. When there is no entry, it either waits for the VM of this
// process that is filling it, or (none is) has v fill it after its boot
// (v.fill) and reports false: v boots. An entry that does not load is
// removed, and v boots and fills it again.
func (v *VM) startFromBootCache(ctx context.Context) (bool, error) {
	m, err := v.bootManifest(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false, v.fail("boot cache", err)
		}
		v.log.Warn("boot cache: the VM's machine is not known; booting", "err", err)
		return false, nil
	}
	dir := filepath.Join(v.cfg.BootCache, m.key())
	for {
		if _, err := os.Stat(filepath.Join(dir, bootCacheOverlay)); err == nil {
			err := v.restoreBoot(ctx, dir)
			if err == nil {
				return true, nil
			}
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return false, err
			}
			v.log.Warn("boot cache: the entry did not load; removing it and booting", "entry", dir, "err", err)
			if rerr := removeDomain(ctx, v.conn, v.name); rerr != nil {
				return false, v.fail("boot cache", errors.Join(err, rerr))
			}
			if rerr := os.RemoveAll(dir); rerr != nil {
				v.log.Warn("boot cache: remove the entry", "entry", dir, "err", rerr)
			}
		}
		f, first := joinBootFlight(dir)
		if first {
			v.fill = &bootFill{dir: dir, m: m, flight: f}
			return false, nil
		}
		select {
		case <-f.done:
			// Filled, or its VM failed: look again.
		case <-ctx.Done():
			return false, v.fail("boot cache: wait for the VM filling it", context.Cause(ctx))
		}
	}
}

// endFill ends v's flight, filled or not, so that VMs waiting for it go on.
func (v *VM) endFill() {
	if v.fill != nil {
		endBootFlight(v.fill.dir, v.fill.flight)
		v.fill = nil
	}
}

// restoreBoot starts v on a copy of the entry's overlay: paused, the
// clean snapshot loaded in place, then running.
func (v *VM) restoreBoot(ctx context.Context, dir string) error {
	t0 := time.Now()
	if err := v.createOverlay(ctx); err != nil {
		return err
	}
	if err := v.overlayIn(ctx, filepath.Join(dir, bootCacheOverlay)); err != nil {
		return v.fail("boot cache: copy the entry's overlay", err)
	}
	// Used: pruning keeps what is used.
	now := time.Now()
	os.Chtimes(filepath.Join(dir, bootCacheManifest), now, now)
	t1 := time.Now()
	if err := v.defineAndBoot(ctx, true); err != nil {
		return err
	}
	dom, err := v.domain(ctx)
	if err != nil {
		return v.fail("boot cache", err)
	}
	if err := v.redefineClean(ctx, dom); err != nil {
		return v.fail("boot cache: redefine the clean snapshot", err)
	}
	t2 := time.Now()
	if err := loadvm(ctx, v.conn, dom, SnapshotName); err != nil {
		return v.fail("boot cache: load the clean snapshot", err)
	}
	if err := v.conn.resume(ctx, dom); err != nil {
		return v.fail("boot cache: resume", err)
	}
	t3 := time.Now()
	if err := v.waitReady(context.WithValue(ctx, restoringKey{}, true)); err != nil {
		return err
	}
	v.log.Info("started from the boot cache", "entry", dir, "took", time.Since(t0), "overlay", t1.Sub(t0),
		"define_start", t2.Sub(t1), "loadvm", t3.Sub(t2), "ready", time.Since(t3))
	return nil
}

// redefineClean writes libvirt's record of the clean snapshot, which the
// overlay holds, for v's domain: libvirt's revert (RevertLibvirt) starts a
// new QEMU from that record's domain definition.
func (v *VM) redefineClean(ctx context.Context, dom libvirt.Domain) error {
	var domXML string
	err := v.conn.do(ctx, "domain xml", func(lv *libvirt.Libvirt) error {
		var err error
		domXML, err = lv.DomainGetXMLDesc(dom, 0)
		return err
	})
	if err != nil {
		return err
	}
	x := "<domainsnapshot><name>" + SnapshotName + "</name><description>legato clean state</description>" +
		"<state>paused</state><creationTime>" + strconv.FormatInt(time.Now().Unix(), 10) + "</creationTime>" +
		"<memory snapshot='internal'/><disks><disk name='vda' snapshot='internal'/></disks>" +
		domXML + "</domainsnapshot>"
	return v.conn.do(ctx, "redefine snapshot", func(lv *libvirt.Libvirt) error {
		_, err := lv.DomainSnapshotCreateXML(dom, x, uint32(libvirt.DomainSnapshotCreateRedefine))
		return err
	})
}

// snapshotAndFill takes the clean snapshot with the guest paused, copies
// the overlay into the boot cache entry, and resumes the guest. A copy
// that fails is only logged: v itself is fine.
func (v *VM) snapshotAndFill(ctx context.Context) (err error) {
	dom, err := v.domain(ctx)
	if err != nil {
		return v.fail("create snapshot", err)
	}
	// Paused, QEMU has written its qcow2 metadata to the file and writes
	// nothing more: a copy of the file is a whole image.
	if err := v.conn.do(ctx, "suspend", func(lv *libvirt.Libvirt) error { return lv.DomainSuspend(dom) }); err != nil {
		return v.fail("boot cache: suspend", err)
	}
	defer func() {
		// Resume even when the caller gave up: a VM left paused is lost.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.cfg.CallTimeout)
		defer cancel()
		if rerr := v.conn.resume(rctx, dom); rerr != nil {
			err = errors.Join(err, v.fail("boot cache: resume", rerr))
		}
	}()
	if err := v.snapshot(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	n, ferr := fillBootEntry(v.fill.dir, v.fill.m, func(dst string) error { return v.overlayOut(ctx, dst) })
	if ferr != nil {
		v.log.Warn("boot cache: not filled; later VMs boot", "entry", v.fill.dir, "err", ferr)
		return nil
	}
	v.log.Info("boot cache filled", "entry", v.fill.dir, "bytes", n, "took", time.Since(t0))
	return nil
}

// overlayOut copies v's overlay to the local file dst.
func (v *VM) overlayOut(ctx context.Context, dst string) error {
	if !v.host.Remote() {
		return copyFileOver(v.overlay, dst)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = v.overlayVolume(ctx, func(s *storage, vol libvirt.StorageVol) error { return s.read(ctx, vol, f) })
	return errors.Join(err, f.Close())
}

// overlayIn copies the local file src over v's overlay.
func (v *VM) overlayIn(ctx context.Context, src string) error {
	if !v.host.Remote() {
		return copyFileOver(src, v.overlay)
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return v.overlayVolume(ctx, func(s *storage, vol libvirt.StorageVol) error {
		return s.write(ctx, vol, f, uint64(st.Size()))
	})
}

// overlayVolume runs f on v's overlay volume.
func (v *VM) overlayVolume(ctx context.Context, f func(*storage, libvirt.StorageVol) error) error {
	s := v.host.storage(v.conn)
	p, err := s.pool(ctx)
	if err != nil {
		return err
	}
	vol, ok, err := s.volume(ctx, p, overlayVolume(v.name))
	if err == nil && !ok {
		err = fmt.Errorf("no overlay volume %s", overlayVolume(v.name))
	}
	if err != nil {
		return err
	}
	return f(s, vol)
}

// fillBootEntry writes the entry dir with copyOut, which writes the
// overlay to the file it is given: into a directory of its own first,
// renamed into place whole, so that no reader sees half an entry. It also
// prunes the cache (pruneBootCache).
func fillBootEntry(dir string, m bootManifest, copyOut func(dst string) error) (int64, error) {
	root := filepath.Dir(dir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return 0, err
	}
	pruneBootCache(root)
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return 0, err
	}
	tmp := dir + bootTmpInfix + hex.EncodeToString(suffix[:])
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp) // nothing left after the rename
	if err := copyOut(filepath.Join(tmp, bootCacheOverlay)); err != nil {
		return 0, err
	}
	st, err := os.Stat(filepath.Join(tmp, bootCacheOverlay))
	if err != nil {
		return 0, err
	}
	m.Taken, m.Bytes = time.Now().UTC(), st.Size()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(tmp, bootCacheManifest), append(b, '\n'), 0o600); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			// Another process filled it first: same machine, same image.
			return st.Size(), nil
		}
		return 0, err
	}
	return st.Size(), nil
}

// bootTmpInfix marks an entry being written.
const bootTmpInfix = ".tmp-"

// An entry's name, and the name of one being written: pruning touches
// nothing else in the directory, which the user chose.
var (
	bootEntryRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
	bootTmpRE   = regexp.MustCompile(`^[0-9a-f]{32}` + regexp.QuoteMeta(bootTmpInfix) + `[0-9a-f]{8}$`)
)

// bootUnusedMax is how long an entry stays unused before pruning removes
// it: an entry of a remote host's image cannot be checked from here.
const bootUnusedMax = 30 * 24 * time.Hour

// pruneBootCache removes the entries of root whose base image volume on
// this machine is gone (a changed image is a new volume: they would never
// load again), entries no VM started from in bootUnusedMax, and entries
// being written that a killed run left over an hour ago.
func pruneBootCache(root string) {
	des, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, de := range des {
		p := filepath.Join(root, de.Name())
		if !de.IsDir() || !bootEntryRE.MatchString(de.Name()) && !bootTmpRE.MatchString(de.Name()) {
			continue
		}
		if bootTmpRE.MatchString(de.Name()) {
			if info, err := de.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
				os.RemoveAll(p)
			}
			continue
		}
		manifest := filepath.Join(p, bootCacheManifest)
		b, err := os.ReadFile(manifest)
		if err != nil {
			continue
		}
		var m bootManifest
		if json.Unmarshal(b, &m) != nil || m.Image == "" {
			continue
		}
		if info, err := os.Stat(manifest); err == nil && time.Since(info.ModTime()) > bootUnusedMax {
			os.RemoveAll(p)
			continue
		}
		if _, err := os.Stat(m.Image); m.Local && errors.Is(err, fs.ErrNotExist) {
			os.RemoveAll(p)
		}
	}
}

// copyFileOver copies src's bytes over dst, which keeps its owner and mode
// (an overlay volume libvirt made).
func copyFileOver(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}
