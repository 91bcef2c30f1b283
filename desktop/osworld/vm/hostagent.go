package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// A remote host's VMs fork through a host agent (`legato rl host-agent`,
// package hostagent) that runs on the host, started over the host's SSH
// connection: the template's RAM file never leaves the host. What this
// package gives it is below: the agent's side takes a template of a
// domain its host runs (TemplateOf), the fleet's side names the domain
// (VM.DomainRef) and starts the agent (Host.StartCommand).

// DomainRef is what a host agent needs to take a template of a VM that
// runs on its host: the domain, its overlay, the base image under it, the
// guest RAM's size and the guest's ports its forwards lead to (zero: the
// defaults), which its clones' forwards lead to too.
type DomainRef struct {
	Name         string `json:"name"`
	Overlay      string `json:"overlay"`
	Base         string `json:"base"`
	MemoryMiB    int    `json:"memory_mib"`
	GuestPort    int    `json:"guest_port,omitempty"`
	DevToolsPort int    `json:"devtools_port,omitempty"`
	VLCPort      int    `json:"vlc_port,omitempty"`
}

// Validate reports which field of a DomainRef is missing.
func (d DomainRef) Validate() error {
	switch {
	case d.Name == "":
		return errors.New("domain name is empty")
	case d.Overlay == "":
		return fmt.Errorf("domain %s: overlay path is empty", d.Name)
	case d.Base == "":
		return fmt.Errorf("domain %s: base image path is empty", d.Name)
	case d.MemoryMiB <= 0:
		return fmt.Errorf("domain %s: memory_mib %d: want the guest RAM in MiB", d.Name, d.MemoryMiB)
	}
	for _, p := range []int{d.GuestPort, d.DevToolsPort, d.VLCPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("domain %s: guest port %d: want 1-65535, or 0 for the default", d.Name, p)
		}
	}
	return nil
}

// DomainRef names the VM for a host agent that takes its template on the
// VM's host.
func (v *VM) DomainRef() DomainRef {
	return DomainRef{Name: v.name, Overlay: v.overlay, Base: v.images[RoleBase], MemoryMiB: v.cfg.MemoryMiB,
		GuestPort: v.cfg.GuestPort, DevToolsPort: v.cfg.DevToolsPort, VLCPort: v.cfg.VLCPort}
}

// ErrSavevmUnsafe means taking a template left QEMU's x-ignore-shared on:
// the VM's snapshots would leave guest RAM out, so it must take none.
var ErrSavevmUnsafe = errors.New("snapshots unsafe after a template")

// RefuseSavevm makes the VM refuse snapshots (taking and loading them)
// until a new QEMU runs it: a template taken of it on its host (by a host
// agent) could not turn x-ignore-shared off again.
func (v *VM) RefuseSavevm(why error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.noSavevm = why
}

// TemplateOf takes a template of a domain that runs on this machine, on
// cfg's first host (default qemu:///system), as VM.Template does for a VM
// this process started: it is how a host agent takes one for a fleet on
// another machine. cfg.ForkDir and cfg.NamePrefix say where the template
// goes; d's guest ports replace cfg's. An error wrapping ErrSavevmUnsafe says the VM must take no
// snapshots any more (VM.RefuseSavevm).
func TemplateOf(ctx context.Context, cfg Config, d DomainRef) (*Template, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if err := checkPrefix(cfg.withDefaults().NamePrefix); err != nil {
		return nil, err
	}
	cfg.Fork, cfg.MemoryMiB = true, d.MemoryMiB
	cfg.GuestPort, cfg.DevToolsPort, cfg.VLCPort = d.GuestPort, d.DevToolsPort, d.VLCPort
	cfg = cfg.withDefaults()
	h, err := OpenHost(cfg.Hosts[0], cfg, HostOptions{})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if h.Remote() {
		return nil, fmt.Errorf("%w: host %s is another machine: a template is taken where its domain runs", ErrNotForkable, h.Name())
	}
	v := &VM{cfg: cfg, name: d.Name, host: h, overlay: d.Overlay, images: map[string]string{RoleBase: d.Base},
		conn: h.connect(), log: cfg.Logger.With("vm", d.Name)}
	defer v.conn.close()
	v.closeCtx, v.closeNow = context.WithCancel(context.Background())
	defer v.closeNow()
	t, err := v.Template(ctx)
	if err != nil {
		if why := v.savevmRefused(); why != nil {
			err = fmt.Errorf("%w: %w", ErrSavevmUnsafe, err)
		}
		return nil, err
	}
	return t, nil
}

// HostCommand is a command running on a remote host, started over the
// host's SSH connection (an exec channel): its stdin and stdout are the
// channel's. It ends when its stdin closes and it exits, or when the SSH
// connection does (sshd then closes its pipes).
type HostCommand struct {
	sess   *ssh.Session
	stdin  io.WriteCloser
	stdout io.Reader
	stderr *tailBuffer

	closeOnce sync.Once
}

// Stdin writes to the command's standard input; closing it sends EOF.
func (c *HostCommand) Stdin() io.WriteCloser { return c.stdin }

// Stdout reads the command's standard output.
func (c *HostCommand) Stdout() io.Reader { return c.stdout }

// Stderr is the end of what the command wrote to its standard error.
func (c *HostCommand) Stderr() string { return c.stderr.String() }

// Wait waits until the command exited and says how.
func (c *HostCommand) Wait() error {
	err := c.sess.Wait()
	if err != nil {
		if tail := strings.TrimSpace(c.Stderr()); tail != "" {
			err = fmt.Errorf("%w: %s", err, tail)
		}
	}
	return err
}

// Close closes the channel: the command's pipes close and sshd ends it.
func (c *HostCommand) Close() error {
	c.closeOnce.Do(func() { c.sess.Close() })
	return nil
}

// StartCommand runs argv on the remote host through its SSH connection,
// as the user legato logs in as. The words are quoted for the login
// shell, so none is split or expanded. A local host has no SSH connection:
// run the command here instead.
func (h *Host) StartCommand(ctx context.Context, argv []string) (*HostCommand, error) {
	if h.link == nil {
		return nil, fmt.Errorf("host %s is this machine: it runs commands without SSH", h.Name())
	}
	if len(argv) == 0 {
		return nil, errors.New("host command: empty argv")
	}
	c, err := h.link.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("host %s: %w", h.Name(), err)
	}
	sess, err := c.NewSession()
	if err != nil {
		return nil, fmt.Errorf("host %s: open a session: %w", h.Name(), err)
	}
	hc := &HostCommand{sess: sess, stderr: &tailBuffer{max: 4 << 10}}
	sess.Stderr = hc.stderr
	if hc.stdin, err = sess.StdinPipe(); err == nil {
		hc.stdout, err = sess.StdoutPipe()
	}
	if err == nil {
		err = sess.Start(shellWords(argv))
	}
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("host %s: run %s: %w", h.Name(), argv[0], err)
	}
	return hc, nil
}

// shellWords quotes each word for a POSIX shell and joins them.
func shellWords(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// CheckForkPlace reports what is wrong with a fork directory (absolute;
// empty for DefaultForkDir) and a name prefix (empty for
// DefaultNamePrefix), naming the one that is.
func CheckForkPlace(forkDir, prefix string) error {
	if forkDir != "" && !filepath.IsAbs(forkDir) {
		return fmt.Errorf("fork dir %q: want an absolute path", forkDir)
	}
	if prefix == "" {
		return nil
	}
	return checkPrefix(prefix)
}
