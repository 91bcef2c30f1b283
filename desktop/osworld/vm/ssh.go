package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Defaults of SSHConfig.
const (
	DefaultSSHDialTimeout    = 20 * time.Second
	DefaultSSHKeepAlive      = 10 * time.Second
	DefaultSSHKeepAliveCount = 3
)

// SSHConfig says how legato logs in to qemu+ssh hosts (and to the SSH
// address of qemu+tls hosts). The zero value reads keys and known hosts
// where OpenSSH does.
type SSHConfig struct {
	// KnownHosts are the known_hosts files a host's key must be in (nil:
	// ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts). A host's
	// ?known_hosts= parameter replaces them for that host. Host keys are
	// always checked: an unknown or changed key fails the connection.
	KnownHosts []string
	// IdentityFiles are private keys to log in with (nil: those of
	// ~/.ssh/id_ed25519, id_ecdsa and id_rsa that exist; an empty list:
	// none). A host's ?keyfile= parameter is tried first. Keys with a
	// passphrase are skipped: add them to ssh-agent instead.
	IdentityFiles []string
	// NoAgent keeps legato from asking the agent at $SSH_AUTH_SOCK for
	// keys.
	NoAgent bool
	// DialTimeout bounds connecting and logging in (default 20s).
	DialTimeout time.Duration
	// KeepAlive is the interval of keep-alive requests (default 10s);
	// after KeepAliveCount (default 3) intervals without an answer the
	// connection counts as lost: every call through it fails and the host
	// is marked down.
	KeepAlive      time.Duration
	KeepAliveCount int
}

func (c SSHConfig) withDefaults() SSHConfig {
	home, _ := os.UserHomeDir()
	if c.KnownHosts == nil {
		if home != "" {
			c.KnownHosts = append(c.KnownHosts, filepath.Join(home, ".ssh", "known_hosts"))
		}
		c.KnownHosts = append(c.KnownHosts, "/etc/ssh/ssh_known_hosts")
	}
	if c.IdentityFiles == nil && home != "" {
		for _, n := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			c.IdentityFiles = append(c.IdentityFiles, filepath.Join(home, ".ssh", n))
		}
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultSSHDialTimeout
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = DefaultSSHKeepAlive
	}
	if c.KeepAliveCount <= 0 {
		c.KeepAliveCount = DefaultSSHKeepAliveCount
	}
	return c
}

// ErrHostKey means an SSH host's key is not in known_hosts, or differs
// from the one there. legato never skips the check.
var ErrHostKey = errors.New("ssh host key not verified")

// sshLink is one host's SSH connection, shared by every libvirt connection
// and guest connection to the host. It dials on first use and again after
// the connection was lost; a keep-alive notices a host that stopped
// answering and closes the connection, which fails everything going
// through it at once. Safe for concurrent use.
type sshLink struct {
	target *sshTarget
	cfg    SSHConfig
	log    *slog.Logger
	// lost is called (from the link's own goroutine) when an established
	// connection is lost.
	lost func(error)

	mu     sync.Mutex
	client *ssh.Client
	agent  net.Conn // the agent connection the client's signers use
	closed bool
	wg     sync.WaitGroup // the watcher and keep-alive goroutines
}

func newSSHLink(t *sshTarget, cfg SSHConfig, log *slog.Logger, lost func(error)) *sshLink {
	return &sshLink{target: t, cfg: cfg.withDefaults(), log: log, lost: lost}
}

// get returns the live client, dialing one if needed.
func (l *sshLink) get(ctx context.Context) (*ssh.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, net.ErrClosed
	}
	if l.client != nil {
		return l.client, nil
	}
	c, ag, err := l.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("ssh %s@%s: %w", l.target.user, l.target.addr(), err)
	}
	l.client, l.agent = c, ag
	done := make(chan struct{})
	silent := make(chan error, 1)
	l.wg.Add(2)
	go l.watch(c, ag, done, silent)
	go l.keepAlive(c, done, silent)
	return c, nil
}

// watch waits until the connection ends, then forgets it and says so.
func (l *sshLink) watch(c *ssh.Client, ag net.Conn, done chan struct{}, silent <-chan error) {
	defer l.wg.Done()
	err := c.Wait()
	close(done)
	select {
	case why := <-silent:
		err = why
	default:
	}
	if ag != nil {
		ag.Close()
	}
	l.mu.Lock()
	mine := l.client == c
	if mine {
		l.client, l.agent = nil, nil
	}
	closed := l.closed
	l.mu.Unlock()
	if mine && !closed && l.lost != nil {
		if err == nil {
			err = errors.New("connection closed")
		}
		l.lost(fmt.Errorf("ssh connection to %s lost: %w", l.target.addr(), err))
	}
}

// keepAlive sends a keep-alive request every interval, one at a time, and
// closes the connection when none was answered for KeepAliveCount
// intervals: a host that stopped answering leaves TCP waiting for many
// minutes otherwise.
func (l *sshLink) keepAlive(c *ssh.Client, done chan struct{}, silent chan<- error) {
	defer l.wg.Done()
	tick := time.NewTicker(l.cfg.KeepAlive)
	defer tick.Stop()
	answered := make(chan struct{}, 1)
	pending := false
	last := time.Now()
	var reqs sync.WaitGroup
	defer reqs.Wait()
	for {
		select {
		case <-done:
			return
		case <-answered:
			pending = false
			last = time.Now()
		case <-tick.C:
			if since := time.Since(last); since > time.Duration(l.cfg.KeepAliveCount)*l.cfg.KeepAlive {
				l.log.Warn("ssh host stopped answering keep-alives; closing the connection", "host", l.target.addr(), "silent", since.Round(time.Millisecond))
				select {
				case silent <- fmt.Errorf("no answer to keep-alives for %v", since.Round(time.Millisecond)):
				default:
				}
				c.Close()
				continue
			}
			if pending {
				continue
			}
			pending = true
			reqs.Add(1)
			go func() {
				defer reqs.Done()
				// Any answer counts, a refusal included: OpenSSH refuses
				// requests it does not know, and answering proves the
				// host is there. An error means the connection is gone,
				// which watch reports.
				if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err == nil {
					answered <- struct{}{}
				}
			}()
		}
	}
}

// dial connects and logs in, bounded by ctx and the dial timeout.
func (l *sshLink) dial(ctx context.Context) (*ssh.Client, net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.DialTimeout)
	defer cancel()
	hostKey, algos, err := hostKeyCheck(l.target, l.cfg)
	if err != nil {
		return nil, nil, err
	}
	signers, ag, err := l.signers()
	if err != nil {
		return nil, nil, err
	}
	cc := &ssh.ClientConfig{
		User:              l.target.user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signers...)},
		HostKeyCallback:   hostKey,
		HostKeyAlgorithms: algos,
		Timeout:           l.cfg.DialTimeout,
	}
	fail := func(err error) (*ssh.Client, net.Conn, error) {
		if ag != nil {
			ag.Close()
		}
		return nil, nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", l.target.addr())
	if err != nil {
		return fail(err)
	}
	// The handshake takes no ctx: a deadline bounds it, and closing the
	// connection when ctx ends cuts it short.
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	conn, chans, reqs, err := ssh.NewClientConn(nc, l.target.addr(), cc)
	if !stop() || err != nil {
		nc.Close()
		if err == nil {
			conn.Close()
			err = context.Cause(ctx)
		}
		var kerr *knownhosts.KeyError
		if errors.As(err, &kerr) {
			err = fmt.Errorf("%w: %w", ErrHostKey, err)
		}
		if len(signers) == 0 {
			err = fmt.Errorf("%w (no key to log in with: none of %v exists and the agent gave none)", err, l.cfg.IdentityFiles)
		}
		return fail(err)
	}
	nc.SetDeadline(time.Time{})
	return ssh.NewClient(conn, chans, reqs), ag, nil
}

// signers returns the keys to log in with: the host's keyfile, the
// identity files that exist, then the agent's, and the agent connection
// (nil without an agent), which must stay open while they are used.
func (l *sshLink) signers() ([]ssh.Signer, net.Conn, error) {
	var files []string
	if l.target.keyFile != "" {
		files = append(files, l.target.keyFile)
	}
	files = append(files, l.cfg.IdentityFiles...)
	var signers []ssh.Signer
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if i == 0 && l.target.keyFile != "" {
				return nil, nil, fmt.Errorf("keyfile %s: %w", f, err)
			}
			if !errors.Is(err, fs.ErrNotExist) {
				l.log.Warn("ssh: cannot read a key file; skipping it", "file", f, "err", err)
			}
			continue
		}
		s, err := ssh.ParsePrivateKey(b)
		var pass *ssh.PassphraseMissingError
		switch {
		case errors.As(err, &pass):
			l.log.Warn("ssh: key has a passphrase; add it to ssh-agent to use it", "file", f)
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("key file %s: %w", f, err)
		}
		signers = append(signers, s)
	}
	sock := os.Getenv("SSH_AUTH_SOCK")
	if l.cfg.NoAgent || sock == "" {
		return signers, nil, nil
	}
	ag, err := net.Dial("unix", sock)
	if err != nil {
		l.log.Warn("ssh: cannot reach the agent; using key files only", "socket", sock, "err", err)
		return signers, nil, nil
	}
	more, err := agent.NewClient(ag).Signers()
	if err != nil {
		ag.Close()
		l.log.Warn("ssh: the agent gave no keys", "err", err)
		return signers, nil, nil
	}
	return append(signers, more...), ag, nil
}

// hostKeyCheck returns the callback that checks the host's key against
// known_hosts, and the host key algorithms to ask for: those of the keys
// known for the host, so a host with several keys does not offer one that
// is not listed (which would fail as a mismatch).
func hostKeyCheck(t *sshTarget, cfg SSHConfig) (ssh.HostKeyCallback, []string, error) {
	files := cfg.KnownHosts
	if t.knownHosts != "" {
		files = []string{t.knownHosts}
	}
	var existing []string
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			existing = append(existing, f)
		} else if t.knownHosts != "" {
			return nil, nil, fmt.Errorf("%w: known_hosts %s: %w", ErrHostKey, f, err)
		}
	}
	if len(existing) == 0 {
		return nil, nil, fmt.Errorf("%w: no known_hosts file (looked for %v): add the host's key, after checking its fingerprint, e.g. ssh-keyscan %s >> ~/.ssh/known_hosts",
			ErrHostKey, files, t.host)
	}
	cb, err := knownhosts.New(existing...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrHostKey, err)
	}
	known := knownKeys(cb, t.addr())
	if len(known) == 0 {
		return nil, nil, fmt.Errorf("%w: %s is not in %v: add its key, after checking its fingerprint, e.g. ssh-keyscan -p %s %s >> ~/.ssh/known_hosts",
			ErrHostKey, t.addr(), existing, t.port, t.host)
	}
	var algos []string
	for _, k := range known {
		for _, a := range keyAlgorithms(k.Key.Type()) {
			if !slices.Contains(algos, a) {
				algos = append(algos, a)
			}
		}
	}
	return cb, algos, nil
}

// knownKeys returns the keys known_hosts lists for addr: asking the
// callback about a key nobody has makes it say which keys it wanted.
func knownKeys(cb ssh.HostKeyCallback, addr string) []knownhosts.KnownKey {
	err := cb(addr, &net.TCPAddr{IP: net.IPv4zero}, probeKey{})
	var kerr *knownhosts.KeyError
	if errors.As(err, &kerr) {
		return kerr.Want
	}
	return nil
}

// probeKey is a public key no host has.
type probeKey struct{}

func (probeKey) Type() string                        { return "legato-probe" }
func (probeKey) Marshal() []byte                     { return []byte("legato-probe-key") }
func (probeKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }

// keyAlgorithms returns the host key algorithms that a key of type t
// signs with.
func keyAlgorithms(t string) []string {
	switch t {
	case ssh.KeyAlgoRSA:
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	case ssh.CertAlgoRSAv01:
		return []string{ssh.CertAlgoRSASHA512v01, ssh.CertAlgoRSASHA256v01, ssh.CertAlgoRSAv01}
	}
	return []string{t}
}

// dialContext opens a connection to addr as the host sees it (its
// 127.0.0.1 included), through the SSH connection.
func (l *sshLink) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.DialContext(ctx, network, addr)
}

// dialUnix connects to a unix socket on the host (libvirtd's). OpenSSH
// allows it unless AllowStreamLocalForwarding is off.
func (l *sshLink) dialUnix(ctx context.Context, path string) (net.Conn, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	nc, err := c.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("ssh %s: open libvirt's socket %s on the host (is libvirtd running there, may %s use it, and does sshd allow AllowStreamLocalForwarding?): %w",
			l.target.addr(), path, l.target.user, err)
	}
	return nc, nil
}

// freePorts returns n distinct ports that were free on the host's
// 127.0.0.1 a moment ago: sshd binds each (a remote forward on port 0)
// and releases them for QEMU, as freePorts does locally. A parked VM's
// port (reservePorts; its clone runs on the host through a host agent) is
// skipped as there.
func (l *sshLink) freePorts(ctx context.Context, n int) ([]int, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range ls {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		ln, err := c.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("ssh %s: pick a free port on the host's 127.0.0.1 (does sshd allow remote forwarding?): %w", l.target.addr(), err)
		}
		// Held until the end either way, so sshd moves on.
		ls = append(ls, ln)
		if p := ln.Addr().(*net.TCPAddr).Port; !reserved(p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// drop closes the current connection, if any (its calls fail); the next
// use dials again.
func (l *sshLink) drop() {
	l.mu.Lock()
	c := l.client
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// close closes the connection for good and waits for its goroutines.
func (l *sshLink) close() {
	l.mu.Lock()
	l.closed = true
	c := l.client
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	l.wg.Wait()
}
