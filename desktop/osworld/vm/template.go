package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"

	"legato/rl/internal/childenv"
)

// The fork path: a Template is a VM's state (guest RAM, device state,
// disk) captured once; Fork starts a clone from it in a fraction of a
// second, the way QEMU's VM templating does it. The template's guest RAM
// is a file on tmpfs that every clone maps copy-on-write
// (memory-backend-file, share=off): clones share the pages they only read
// and own the ones they write. The device state (CPU, devices, about a
// megabyte) is what QEMU's migration sends when x-ignore-shared leaves
// the shared RAM out; a clone loads it with migrate-incoming. The disk is
// a qcow2 layer of the template's changes over the base image, and each
// clone writes its own overlay on it.
//
// libvirt 9.0 cannot start a domain on another domain's RAM file, so
// clones are QEMU processes this package starts itself, with the command
// line libvirt ran the template's VM with (so the devices match the
// state), rewritten where a clone differs (forkargs.go). They run as the
// user libvirt runs QEMU as, die with this process (parent-death signal),
// and live in a directory under Config.ForkDir locked by this process, so
// a later SweepForks finds what a killed run left. A template and its
// clones are on the machine of the process that takes them: a remote
// host's VMs fork there, through the host agent the fleet starts on the
// host over SSH (package hostagent, which calls TemplateOf there).

// DefaultForkDir is where templates and clones live: tmpfs, because guest
// RAM mapped from a file on disk would be written back to it.
const DefaultForkDir = "/dev/shm/legato-fork"

// forkDirPrefix starts a template's directory name after the VMs' prefix.
const forkDirPrefix = "fork-"

// ErrNotForkable means a VM cannot give a template: it runs on another
// machine, or was not started with Config.Fork.
var ErrNotForkable = errNotForkable

// ErrBadTemplate means a template's files changed since it was taken: it
// is never forked again.
var ErrBadTemplate = errors.New("fork template changed")

// Template is a VM's captured state that clones start from.
type Template struct {
	name    string // the directory's name, also the clones' name prefix
	dir     string
	argv    []string // libvirt's argv of the template's VM, argv[0] the binary
	uid     int
	gid     int
	groups  []uint32
	ramSum  [32]byte
	ramStat ramStat // the RAM file as copied: a changed one is never forked
	state   []byte  // QEMU's device state, kept in memory
	// base is the base image's volume under the disk layer, ramBytes
	// the guest RAM's size: what a clone's kept state records.
	base     string
	ramBytes int64
	// kept is the directory of the kept state the template loads
	// (LoadKept): its clones load the whole stream, RAM and all, whose
	// hash must be keptSum.
	kept    string
	keptSum string
	cfg     Config
	log     *slog.Logger
	lock    *os.File // flocked while this process owns the directory
	timings TemplateTimings

	mu       sync.Mutex
	bad      error // why the template must not be forked any more (CheckRAM)
	seq      int
	starting int      // Prestart's clones being started
	spare    []*Clone // started, waiting for their state (Prestart)
	clones   map[*Clone]bool
	closed   bool
}

// TemplateTimings says what capturing a template took.
type TemplateTimings struct {
	// Paused is how long the VM was stopped: the device state, the RAM
	// copy and the disk layer.
	Paused time.Duration
	// State, RAM and Disk are the parts.
	State, RAM, Disk time.Duration
	// RAMBytes is what the RAM copy wrote (non-zero pages); StateBytes
	// the device state's size.
	RAMBytes, StateBytes int64
}

// Name names the template (its directory under Config.ForkDir).
func (t *Template) Name() string { return t.name }

// Dir is the template's directory.
func (t *Template) Dir() string { return t.dir }

// Timings says what capturing the template took.
func (t *Template) Timings() TemplateTimings { return t.timings }

func (t *Template) ramPath() string   { return filepath.Join(t.dir, "ram") }
func (t *Template) diskPath() string  { return filepath.Join(t.dir, "disk.qcow2") }
func (t *Template) statePath() string { return filepath.Join(t.dir, "state") }

// Forkable reports whether Template can work on the VM: it runs on this
// machine, was started with Config.Fork, and this process runs as root
// (it reads guest RAM out of libvirt's QEMU and runs clones as its user).
func (v *VM) Forkable() bool { return v.cfg.Fork && !v.host.Remote() && os.Geteuid() == 0 }

// Template captures the VM's current state as a template: it pauses the
// guest, has QEMU send its device state without the (shared) guest RAM,
// copies the guest RAM to the template's file and the disk's changes to
// the template's layer, then lets the guest run on. The VM must run on
// this machine and have been started with Config.Fork. The guest's clock
// and entropy in a clone are the template's: set them after Fork.
func (v *VM) Template(ctx context.Context) (*Template, error) {
	ctx, cancel, err := v.opCtx(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if v.host.Remote() {
		return nil, v.fail("template", fmt.Errorf("%w: the VM runs on %s, another machine", ErrNotForkable, v.host.Name()))
	}
	if !v.cfg.Fork {
		return nil, v.fail("template", fmt.Errorf("%w: the VM was not started with Config.Fork", ErrNotForkable))
	}
	if os.Geteuid() != 0 {
		return nil, v.fail("template", fmt.Errorf("%w: taking a template needs root (it reads guest RAM out of libvirt's QEMU)", ErrNotForkable))
	}
	p, err := findQEMU(v.name)
	if err != nil {
		return nil, v.fail("template", err)
	}
	t, err := newTemplate(v.cfg, p)
	if err != nil {
		return nil, v.fail("template", err)
	}
	t.base, t.ramBytes = v.images[RoleBase], int64(v.cfg.MemoryMiB)<<20
	if err := t.capture(ctx, v, p); err != nil {
		t.Close()
		return nil, v.fail("template", err)
	}
	v.log.Info("template taken", "template", t.name, "paused", t.timings.Paused, "state_bytes", t.timings.StateBytes,
		"state_sum", t.stateSum(), "ram_bytes", t.timings.RAMBytes, "ram", t.timings.RAM, "disk", t.timings.Disk)
	return t, nil
}

// newTemplate makes the template's directory, locked by this process.
func newTemplate(cfg Config, p qemuProcess) (*Template, error) {
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, err
	}
	name := cfg.NamePrefix + forkDirPrefix + hex.EncodeToString(suffix[:])
	if err := ensureForkDir(cfg.ForkDir, p.gid); err != nil {
		return nil, err
	}
	// Made under a name no sweep matches, locked, then renamed: a sweep
	// never sees it unlocked.
	dir := filepath.Join(cfg.ForkDir, name)
	tmp := filepath.Join(cfg.ForkDir, ".new-"+name)
	if err := os.Mkdir(tmp, 0o750); err != nil {
		return nil, fmt.Errorf("template dir: %w", err)
	}
	lock, err := lockDir(tmp)
	if err == nil {
		if err = os.Rename(tmp, dir); err != nil {
			lock.Close()
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	// QEMU runs as libvirt's QEMU user and must reach the files.
	if err := os.Chown(dir, -1, p.gid); err != nil {
		lock.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("template dir: %w", err)
	}
	return &Template{
		name: name, dir: dir, argv: p.argv, uid: p.uid, gid: p.gid, groups: p.groups, cfg: cfg, lock: lock,
		log: cfg.Logger.With("template", name), clones: map[*Clone]bool{},
	}, nil
}

// lockDir creates and flocks dir's lock file: while it is held, SweepForks
// leaves the directory alone.
func lockDir(dir string) (*os.File, error) {
	f, err := openNoFollow(filepath.Join(dir, "lock"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f, nil
}

// capture pauses the VM and takes its state; the VM runs again when it
// returns, also on an error.
func (t *Template) capture(ctx context.Context, v *VM, p qemuProcess) (err error) {
	dom, err := v.domain(ctx)
	if err != nil {
		return err
	}
	mon := func(ctx context.Context, cmd string, args, out any) error {
		return v.monitorQMP(ctx, dom, cmd, args, out)
	}
	var status struct {
		Running bool `json:"running"`
	}
	if err := mon(ctx, "query-status", nil, &status); err != nil {
		return err
	}
	if !status.Running {
		return errors.New("the guest is not running")
	}
	t0 := time.Now()
	// The resume is deferred before the stop: a stop cut off by ctx may
	// have paused the guest all the same.
	defer func() {
		// Resume even when the caller gave up: a template is never worth
		// a VM left paused. x-ignore-shared goes off again first: the
		// VM's own snapshots (savevm) must keep its RAM. QEMU refuses to
		// change it while a migration runs, so one cut off is cancelled
		// first.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.cfg.CallTimeout)
		defer cancel()
		if err != nil {
			mon(rctx, "migrate_cancel", nil, nil)
			waitMigrationEnd(rctx, mon)
		}
		if serr := setIgnoreShared(rctx, mon, false); serr != nil {
			// Its snapshots would leave its RAM out: refuse them.
			v.mu.Lock()
			v.noSavevm = fmt.Errorf("x-ignore-shared could not be turned off after a template (%w): a snapshot would leave guest RAM out", serr)
			v.mu.Unlock()
			err = errors.Join(err, serr)
		}
		err = errors.Join(err, mon(rctx, "cont", nil, nil))
		t.timings.Paused = time.Since(t0)
	}()
	if err := mon(ctx, "stop", nil, nil); err != nil {
		return err
	}
	t1 := time.Now()
	state, err := t.sendState(ctx, mon)
	if err != nil {
		return fmt.Errorf("device state: %w", err)
	}
	t.state = state
	t.timings.State, t.timings.StateBytes = time.Since(t1), int64(len(state))
	if err := writeFileAs(t.statePath(), state, t.gid); err != nil {
		return err
	}
	if bytes.Contains(state, []byte("pc.ram")) && int64(len(state)) > int64(v.cfg.MemoryMiB)<<20/2 {
		// A QEMU that does not leave shared memfd RAM out (newer ones
		// want a named file) sends it all: clones would load it, not
		// share it.
		t.log.Warn("the device state holds the guest RAM: clones will copy it instead of sharing it", "state_bytes", len(state))
	}
	t2 := time.Now()
	if err := t.copyRAM(p.pid); err != nil {
		return fmt.Errorf("guest RAM: %w", err)
	}
	t3 := time.Now()
	t.timings.RAM = t3.Sub(t2)
	if err := t.copyDisk(ctx, v); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	t.timings.Disk = time.Since(t3)
	return nil
}

// setIgnoreShared sets QEMU's x-ignore-shared migration capability.
func setIgnoreShared(ctx context.Context, mon func(context.Context, string, any, any) error, on bool) error {
	type capability struct {
		Capability string `json:"capability"`
		State      bool   `json:"state"`
	}
	return mon(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []capability{{"x-ignore-shared", on}},
	}, nil)
}

// sendState has the paused QEMU migrate without its shared RAM, and
// returns what it sent.
func (t *Template) sendState(ctx context.Context, mon func(context.Context, string, any, any) error) ([]byte, error) {
	if err := setIgnoreShared(ctx, mon, true); err != nil {
		return nil, err
	}
	var state []byte
	err := migrateToLoopback(ctx, mon, func(r io.Reader) (err error) {
		state, err = io.ReadAll(r)
		return err
	})
	return state, err
}

// migrateToLoopback has the paused QEMU migrate to a socket on 127.0.0.1
// and hands what it sends to recv, which must read it all. QEMU runs in
// libvirt's sandbox, which forbids exec: a TCP socket is what it may open.
func migrateToLoopback(ctx context.Context, mon func(context.Context, string, any, any) error, recv func(io.Reader) error) error {
	ln, err := ListenLoopback()
	if err != nil {
		return err
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		got <- recv(c)
	}()
	if err := mon(ctx, "migrate", map[string]any{"uri": "tcp:" + ln.Addr().String()}, nil); err != nil {
		ln.Close()
		<-got
		return err
	}
	if err := waitMigration(ctx, mon); err != nil {
		ln.Close()
		<-got
		return err
	}
	return <-got
}

// waitMigration polls query-migrate until the migration completed.
// Before it starts QEMU may say "none": that is waited out.
func waitMigration(ctx context.Context, mon func(context.Context, string, any, any) error) error {
	status, desc, err := pollMigration(ctx, mon, false)
	if err == nil && status != "completed" {
		err = fmt.Errorf("qemu migration %s: %s", status, desc)
	}
	return err
}

// waitMigrationEnd waits, as well as it can, until no migration runs.
func waitMigrationEnd(ctx context.Context, mon func(context.Context, string, any, any) error) {
	pollMigration(ctx, mon, true)
}

// pollMigration polls query-migrate until the migration ended, and
// returns how ("completed", "failed", "cancelled"; with noneEnds also
// "none" or "" for no migration at all) with QEMU's error text.
func pollMigration(ctx context.Context, mon func(context.Context, string, any, any) error, noneEnds bool) (status, desc string, err error) {
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := mon(ctx, "query-migrate", nil, &st); err != nil {
			return "", "", err
		}
		switch st.Status {
		case "completed", "failed", "cancelled":
			return st.Status, st.ErrorDesc, nil
		case "", "none":
			if noneEnds {
				return st.Status, st.ErrorDesc, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", "", context.Cause(ctx)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// copyRAM copies the guest RAM out of QEMU's memfd.
func (t *Template) copyRAM(pid int) error {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return err
	}
	var memfds []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && strings.HasPrefix(l, "/memfd:memory-backend-memfd") {
			memfds = append(memfds, filepath.Join(fdDir, e.Name()))
		}
	}
	if len(memfds) != 1 {
		return fmt.Errorf("%w: QEMU %d has %d guest RAM memfds, want 1", ErrNotForkable, pid, len(memfds))
	}
	src, err := os.Open(memfds[0])
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(t.ramPath(), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	n, sum, err := copySparse(dst, src)
	if err == nil {
		// QEMU opens a RAM file read-write even to map it privately
		// (QEMU 7.2's readonly=on maps it read-only, which the guest
		// cannot run on). Clones never write to it as long as nothing
		// discards guest RAM (QEMU would punch holes in the file): no
		// balloon (the domain has none), no virtio-mem, no postcopy.
		// Fork compares its stat, CheckRAM its content.
		err = dst.Chown(t.uid, t.gid)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	t.ramSum, t.timings.RAMBytes = sum, n
	if err == nil {
		t.ramStat, err = statRAM(t.ramPath())
	}
	return err
}

// ramStat is what a stat of the RAM file says that a change would alter.
type ramStat struct {
	ino, size int64
	mtime     time.Time
}

func statRAM(path string) (ramStat, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ramStat{}, err
	}
	return ramStat{ino: int64(st.Ino), size: st.Size, mtime: time.Unix(st.Mtim.Unix())}, nil
}

// copyDisk writes the VM's disk, as the paused guest sees it, as a qcow2
// layer over the base image: only what differs from the base. QEMU holds
// the overlay, so qemu-img reads it with -U (the guest is paused and the
// migration flushed QEMU's caches).
func (t *Template) copyDisk(ctx context.Context, v *VM) error {
	if err := convertLayer(ctx, v.overlay, v.images[RoleBase], t.diskPath()); err != nil {
		return err
	}
	if err := os.Chmod(t.diskPath(), 0o640); err != nil {
		return err
	}
	return os.Chown(t.diskPath(), -1, t.gid)
}

// convertLayer writes the disk the qcow2 overlay holds to dst as a layer
// over base: only what differs from it. QEMU holds the overlay, so
// qemu-img reads it with -U (the guest must be paused, and QEMU's caches
// flushed, as a migration does).
func convertLayer(ctx context.Context, overlay, base, dst string) error {
	convert := exec.CommandContext(ctx, "qemu-img", "convert", "-U", "-f", "qcow2", "-O", "qcow2",
		"-B", base, "-F", "qcow2", overlay, dst)
	convert.Env = childenv.Minimal()
	if out, err := convert.CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img convert: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// writeFileAs writes a file the QEMU user's group can read.
func writeFileAs(path string, b []byte, gid int) error {
	f, err := openNoFollow(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chown(-1, gid)
	}
	return errors.Join(err, f.Close())
}

// monitorQMP runs a QMP command in the domain's QEMU through libvirt.
func (v *VM) monitorQMP(ctx context.Context, dom libvirt.Domain, command string, args, out any) error {
	b, err := qmpRequest(command, args)
	if err != nil {
		return err
	}
	var reply string
	err = v.conn.do(ctx, command, func(lv *libvirt.Libvirt) error {
		var err error
		reply, err = lv.QEMUDomainMonitorCommand(dom, string(b), 0)
		return err
	})
	if err != nil {
		return err
	}
	_, err = qmpReply(command, []byte(reply), out)
	return err
}

// Close kills the template's clones and removes its files.
func (t *Template) Close() error {
	t.mu.Lock()
	t.closed = true
	var cs []*Clone
	for c := range t.clones {
		cs = append(cs, c)
	}
	t.spare = nil
	t.mu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	errs = append(errs, os.RemoveAll(t.dir))
	if t.lock != nil {
		t.lock.Close()
	}
	return errors.Join(errs...)
}

// CheckRAM re-reads the template's RAM file and compares it with the sum
// taken when it was copied; after a mismatch Fork refuses the template.
// Fork itself only compares the file's inode, size and modification time.
func (t *Template) CheckRAM(ctx context.Context) error {
	closed := func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.closed
	}
	f, err := os.Open(t.ramPath())
	if err != nil {
		if closed() {
			return ErrClosed
		}
		return err
	}
	defer f.Close()
	sum, err := ramFileSum(ctx, f)
	if closed() {
		return ErrClosed
	}
	if err != nil {
		return err
	}
	if sum != t.ramSum {
		err := fmt.Errorf("%w: template %s: its RAM file's content changed since it was taken", ErrBadTemplate, t.name)
		t.mu.Lock()
		t.bad = err
		t.mu.Unlock()
		return err
	}
	return nil
}

// stateSum is the device state's hash, for the log.
func (t *Template) stateSum() string {
	s := sha256.Sum256(t.state)
	return hex.EncodeToString(s[:8])
}
