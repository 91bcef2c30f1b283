package vm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// Host is one libvirt host's transport: libvirt connections to its daemon
// (a local socket, SSH or TLS) and connections to addresses as the host
// sees them, its 127.0.0.1 where the guests' ports are forwarded (directly
// on this machine, through the SSH connection otherwise). A Host keeps no
// libvirt connection itself: each VM dials its own. Safe for concurrent
// use.
type Host struct {
	spec HostSpec
	ep   endpoint
	cfg  Config
	log  *slog.Logger
	link *sshLink // the SSH connection; nil for a local host

	images imageSet
}

// HostOptions are the optional parts of OpenHost.
type HostOptions struct {
	// Images are the image files (ImageFiles of the Config), when the
	// caller hashed them once for every host; nil means the host hashes
	// them when it first needs them.
	Images []ImageFile
	// Lost, if not nil, is called from the host's own goroutine when its
	// SSH connection, once established, is lost (the host stopped
	// answering or closed it): every call through the host fails at that
	// moment.
	Lost func(*Host, error)
}

// OpenHost prepares the transport to a host; it does not connect yet.
// cfg's connection settings (SSH, CallTimeout, StoragePool, the image
// files) apply to everything done on the host.
func OpenHost(spec HostSpec, cfg Config, opts HostOptions) (*Host, error) {
	ep, err := spec.endpoint()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	h := &Host{spec: spec, ep: ep, cfg: cfg}
	h.images.files = opts.Images
	h.log = cfg.Logger.With("host", ep.label)
	if ep.ssh != nil {
		h.link = newSSHLink(ep.ssh, cfg.SSH, h.log, func(err error) {
			if opts.Lost != nil {
				opts.Lost(h, err)
			}
		})
	}
	return h, nil
}

// Name labels the host (HostSpec.Label).
func (h *Host) Name() string { return h.ep.label }

// Spec is what the host was opened with.
func (h *Host) Spec() HostSpec { return h.spec }

// Remote reports whether the host is another machine, whose guests' ports
// are reached through SSH.
func (h *Host) Remote() bool { return h.link != nil }

// DialContext connects to addr as the host sees it: "127.0.0.1:PORT" is
// the host's loopback, where its VMs' guest ports are forwarded. For a
// remote host the connection goes through its SSH connection (an SSH
// direct-tcpip channel): the ports are never exposed beyond the host's
// loopback.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if h.link != nil {
		c, err := h.link.dialContext(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", h.ep.label, err)
		}
		return c, nil
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	return d.DialContext(ctx, network, addr)
}

// dialLibvirt opens a connection to the host's libvirtd.
func (h *Host) dialLibvirt(ctx context.Context) (net.Conn, error) {
	switch h.ep.transport {
	case transportSSH:
		return h.link.dialUnix(ctx, h.ep.socket)
	case transportTLS:
		opts := []dialers.TLSOption{dialers.UseTLSPort(h.ep.tlsPort)}
		if h.ep.pkiPath != "" {
			opts = append(opts, dialers.UsePKIPath(h.ep.pkiPath))
		}
		return dialers.NewTLS(h.ep.tlsHost, opts...).Dial()
	}
	d := net.Dialer{Timeout: h.cfg.CallTimeout}
	return d.DialContext(ctx, "unix", h.ep.socket)
}

// freePorts returns n distinct ports that were free on the host's
// 127.0.0.1 a moment ago, for QEMU's forwards.
func (h *Host) freePorts(ctx context.Context, n int) ([]int, error) {
	if h.link != nil {
		return h.link.freePorts(ctx, n)
	}
	return freePorts(n)
}

// connect returns a new bounded libvirt connection to the host.
func (h *Host) connect() *conn { return newConn(h, h.cfg.CallTimeout) }

// Ping connects to the host's libvirtd and asks for its version, which
// proves the host answers.
func (h *Host) Ping(ctx context.Context) error {
	c := h.connect()
	defer c.close()
	return c.do(ctx, "ping", func(lv *libvirt.Libvirt) error {
		_, err := lv.ConnectGetLibVersion()
		return err
	})
}

// Drop closes the host's SSH connection, if any, which fails every call
// going through it; the next call connects again. The pool drops a host it
// marked down, so no half-dead connection lingers.
func (h *Host) Drop() {
	if h.link != nil {
		h.link.drop()
	}
}

// Close closes the host's SSH connection for good and waits for its
// goroutines. VMs on the host must be closed first.
func (h *Host) Close() {
	if h.link != nil {
		h.link.close()
	}
}

// where says how the host's libvirtd is reached, for errors.
func (h *Host) where() string {
	switch h.ep.transport {
	case transportSSH:
		return fmt.Sprintf("socket %s through ssh %s@%s", h.ep.socket, h.ep.ssh.user, h.ep.ssh.addr())
	case transportTLS:
		return fmt.Sprintf("tls %s", net.JoinHostPort(h.ep.tlsHost, h.ep.tlsPort))
	}
	return fmt.Sprintf("socket %s; is libvirtd running? .ci/libvirt-up.sh starts it", h.ep.socket)
}
