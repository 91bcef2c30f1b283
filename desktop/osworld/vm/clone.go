package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"legato/rl/internal/childenv"
)

// cloneEnv is a clone QEMU's environment: libvirt starts its QEMUs with
// little more (a PATH, the C locale, a HOME of the domain's own).
func cloneEnv(dir string) []string { return childenv.Minimal("HOME=" + dir) }

// Clone is a QEMU started from a Template.
type Clone struct {
	t      *Template
	name   string
	dir    string
	cmd    *exec.Cmd
	mon    *qmp
	ports  Ports
	exited chan struct{}
	log    *slog.Logger

	// Restore is how long Fork took from taking the started QEMU to the
	// guest running: loading the device state and resuming.
	restore time.Duration
	// Started is how long starting the QEMU took (before Fork when it
	// was prestarted).
	started time.Duration
	spare   bool

	closeOnce sync.Once
	closeErr  error
}

// Name is the clone's QEMU -name.
func (c *Clone) Name() string { return c.name }

// Ports are the host ports on 127.0.0.1 forwarded to the clone's guest.
func (c *Clone) Ports() Ports { return c.ports }

// PID is the clone's QEMU process.
func (c *Clone) PID() int { return c.cmd.Process.Pid }

// Restore is how long Fork took from a started QEMU to a running guest.
func (c *Clone) Restore() time.Duration { return c.restore }

// Started is how long starting the clone's QEMU process took, and whether
// that happened ahead of Fork (Prestart).
func (c *Clone) Started() (time.Duration, bool) { return c.started, c.spare }

// Prestart starts QEMU processes for up to n clones, paused before their
// state, so that Fork needs no process start. They hold their forwarded
// ports from now on.
func (t *Template) Prestart(ctx context.Context, n int) error {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return ErrClosed
		}
		if len(t.spare)+t.starting >= n {
			t.mu.Unlock()
			return nil
		}
		// Counted while it starts, so that callers at once start n in
		// all, not n each.
		t.starting++
		t.mu.Unlock()
		c, err := t.startClone(ctx)
		t.mu.Lock()
		t.starting--
		t.mu.Unlock()
		if err != nil {
			return err
		}
		c.spare = true
		t.mu.Lock()
		closed := t.closed
		if !closed {
			t.spare = append(t.spare, c)
		}
		t.mu.Unlock()
		if closed {
			c.Close()
			return ErrClosed
		}
	}
}

// Fork starts a clone of the template: a prestarted QEMU if there is one,
// else a new one; it loads the device state over the template's RAM and
// disk and lets the guest run. The guest answers when its own programs
// get to it (a readiness wait is the caller's).
func (t *Template) Fork(ctx context.Context) (*Clone, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	// A stat per fork; the full sum is CheckRAM's, off the fork's path.
	// A kept state's clones have RAM of their own, no file.
	if st, err := statRAM(t.ramPath()); t.kept == "" && (err != nil || st != t.ramStat) {
		return nil, errors.Join(fmt.Errorf("template %s: its RAM file changed or went since it was taken", t.name), err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	if t.bad != nil {
		t.mu.Unlock()
		return nil, t.bad
	}
	var c *Clone
	if n := len(t.spare); n > 0 {
		c, t.spare = t.spare[0], t.spare[1:]
	}
	t.mu.Unlock()
	if c != nil {
		err := c.load(ctx)
		if err == nil {
			return c, nil
		}
		// A QEMU that waited may have died meanwhile: that is the
		// spare's failure, not the template's; a new one tries again.
		c.log.Warn("a clone started ahead did not take the state; starting another", "err", err)
		c.Close()
		if ctx.Err() != nil {
			return nil, err
		}
	}
	c, err := t.startClone(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.load(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("clone %s: %w", c.name, err), c.Close())
	}
	return c, nil
}

// startClone starts a clone's QEMU, paused before its state.
func (t *Template) startClone(ctx context.Context) (*Clone, error) {
	t0 := time.Now()
	t.mu.Lock()
	t.seq++
	name := fmt.Sprintf("%s-c%d", t.name, t.seq)
	t.mu.Unlock()
	dir := filepath.Join(t.dir, name)
	if err := os.Mkdir(dir, 0o770); err != nil {
		return nil, err
	}
	c := &Clone{t: t, name: name, dir: dir, exited: make(chan struct{}), log: t.log.With("clone", name)}
	fail := func(err error) (*Clone, error) {
		return nil, errors.Join(fmt.Errorf("start clone %s: %w", name, err), c.Close())
	}
	if err := os.Chown(dir, t.uid, t.gid); err != nil {
		return fail(err)
	}
	overlay := filepath.Join(dir, "disk.qcow2")
	create := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", t.diskPath(), overlay)
	create.Env = childenv.Minimal()
	out, err := create.CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("qemu-img create: %w: %s", err, bytes.TrimSpace(out)))
	}
	if err := os.Chown(overlay, t.uid, t.gid); err != nil {
		return fail(err)
	}
	var lastErr error
	for range startAttempts {
		ps, err := freePorts(3)
		if err != nil {
			return fail(err)
		}
		c.ports = Ports{Guest: ps[0], DevTools: ps[1], VLC: ps[2]}
		err = c.startQEMU(ctx, overlay)
		if err == nil {
			c.started = time.Since(t0)
			t.mu.Lock()
			closed := t.closed
			if !closed {
				t.clones[c] = true
			}
			t.mu.Unlock()
			if closed {
				// Close ran meanwhile and did not see this one.
				return fail(ErrClosed)
			}
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil || !isPortTaken(err) {
			break
		}
	}
	return fail(lastErr)
}

// startQEMU runs the clone's QEMU and connects to its monitor.
func (c *Clone) startQEMU(ctx context.Context, overlay string) error {
	t := c.t
	monitor := filepath.Join(c.dir, "qmp.sock")
	os.Remove(monitor)
	ram := t.ramPath()
	if t.kept != "" {
		ram = ""
	}
	args, err := cloneArgs(t.argv[1:], cloneSpec{
		Name: c.name, Monitor: monitor, RAM: ram, Overlay: overlay,
		Netdev: netdevArg(c.ports.forwards(t.cfg)),
	})
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(t.argv[0], args...)
	cmd.Dir = c.dir
	// Not ours: the clone runs as QEMU's user, who can read it.
	cmd.Env = cloneEnv(c.dir)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// The clone dies with this process, whatever ends it (kill -9
		// included), and stays out of the terminal's Ctrl-C.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	if os.Geteuid() == 0 && t.uid != 0 {
		// The groups too: libvirt's QEMU may open /dev/kvm through its
		// kvm group.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(t.uid), Gid: uint32(t.gid), Groups: t.groups}
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	c.cmd = cmd
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	c.exited = exited
	// QEMU creates the monitor socket early; wait for it (or its end).
	deadline := time.Now().Add(t.cfg.CallTimeout)
	for {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := dialQMP(mctx, monitor)
		cancel()
		if err == nil {
			c.mon = q
			return nil
		}
		select {
		case <-exited:
			c.cmd = nil
			return fmt.Errorf("qemu exited: %s", bytes.TrimSpace(stderr.Bytes()))
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu monitor did not come up in %v: %w", t.cfg.CallTimeout, err)
		}
	}
}

// netdevArg is the -netdev value of legato's user network with forwards.
func netdevArg(fs []forward) string { return domainSpec{Forwards: fs}.NetdevArg() }

// load feeds the template's state to the waiting QEMU and resumes the
// guest.
func (c *Clone) load(ctx context.Context) error {
	t0 := time.Now()
	mon := func(ctx context.Context, cmd string, args, out any) error { return c.mon.run(ctx, cmd, args, out) }
	// A template's state leaves the shared RAM out; a kept state's
	// stream holds it, and QEMU reads it only with the capability as the
	// sender had it.
	if err := setIgnoreShared(ctx, mon, c.t.kept == ""); err != nil {
		return err
	}
	state, err := c.t.openState()
	if err != nil {
		return err
	}
	defer state.Close()
	sock := filepath.Join(c.dir, "in.sock")
	if err := mon(ctx, "migrate-incoming", map[string]any{"uri": "unix:" + sock}, nil); err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	// A QEMU that stops reading must not hold the caller past ctx.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	_, err = io.Copy(conn, readerCtx{ctx, state})
	stop()
	conn.Close()
	if err != nil {
		return err
	}
	if err := waitMigration(ctx, mon); err != nil {
		return err
	}
	if err := mon(ctx, "cont", nil, nil); err != nil {
		return err
	}
	c.restore = time.Since(t0)
	c.log.Debug("clone running", "restore", c.restore, "pid", c.PID())
	return nil
}

// Close kills the clone's QEMU and removes its files. It is idempotent.
func (c *Clone) Close() error {
	c.closeOnce.Do(func() {
		if c.mon != nil {
			c.mon.close()
		}
		if c.cmd != nil && c.cmd.Process != nil {
			// The whole process group: QEMU forks no helpers here, but
			// nothing of it may outlive the clone.
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
		c.closeErr = os.RemoveAll(c.dir)
		c.t.mu.Lock()
		delete(c.t.clones, c)
		c.t.mu.Unlock()
	})
	return c.closeErr
}

// forwardRule is HMP's hostfwd rule of a host port on 127.0.0.1.
func forwardRule(host, guest int) string {
	return fmt.Sprintf("tcp:127.0.0.1:%d-:%d", host, guest)
}

// forwards pairs a VM's ports with the guest ports of cfg.
func (p Ports) forwards(cfg Config) []forward {
	return []forward{{p.Guest, cfg.GuestPort}, {p.DevTools, cfg.DevToolsPort}, {p.VLC, cfg.VLCPort}}
}

// Forward adds forwards from the host ports of p on 127.0.0.1 to the
// clone's guest, next to its own Ports: a parked VM's ports.
func (c *Clone) Forward(ctx context.Context, p Ports) error {
	for _, f := range p.forwards(c.t.cfg) {
		cmd := "hostfwd_add legatonet " + forwardRule(f.Host, f.Guest)
		var out string
		if err := c.mon.run(ctx, "human-monitor-command", map[string]string{"command-line": cmd}, &out); err != nil {
			return err
		}
		if err := hmpResult(cmd, out); err != nil {
			return err
		}
	}
	return nil
}
