package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultURI          = "qemu:///system"
	DefaultNamePrefix   = "legato-"
	DefaultVCPUs        = 4
	DefaultMemoryMiB    = 4096
	DefaultOverlayDir   = "/var/tmp/legato"
	DefaultCallTimeout  = 60 * time.Second
	DefaultBootTimeout  = 5 * time.Minute
	DefaultReadyTry     = 2 * time.Second
	DefaultGuestPort    = 5000
	DefaultDevToolsPort = 9222
	DefaultVLCPort      = 8080
	// DefaultSocket is the libvirtd socket that qemu:///system is reached
	// through.
	DefaultSocket = "/run/libvirt/libvirt-sock"
)

// Accel is how QEMU runs the guest's CPU.
type Accel string

const (
	// AccelAuto chooses KVM where it really works and TCG otherwise (see
	// DetectAccel). The zero value means the same.
	AccelAuto Accel = "auto"
	// AccelKVM uses hardware virtualisation: <domain type='kvm'>.
	AccelKVM Accel = "kvm"
	// AccelTCG uses QEMU's software emulation: <domain type='qemu'>. It is
	// 10-20x slower for CPU-bound guest code.
	AccelTCG Accel = "tcg"
)

// UnmarshalText sets a from "auto", "kvm" or "tcg"; empty means auto. It
// lets an Accel be a flag's value (flag.TextVar) or a config file's.
func (a *Accel) UnmarshalText(b []byte) error {
	switch v := Accel(b); v {
	case AccelAuto, AccelKVM, AccelTCG:
		*a = v
		return nil
	case "":
		*a = AccelAuto
		return nil
	}
	return fmt.Errorf("accel %q: want auto, kvm or tcg", b)
}

// MarshalText returns a as text.
func (a Accel) MarshalText() ([]byte, error) { return []byte(a), nil }

// ReadyFunc reports whether the guest server answers on the VM's forwarded
// ports; a nil error means ready. It is called repeatedly, each time with a
// ctx bounded by Config.ReadyTry, until it succeeds or Config.BootTimeout
// passes.
type ReadyFunc func(ctx context.Context, ports Ports) error

// Config says how to run the VMs. The zero value of each field means its
// default; BaseImage is the only required field.
type Config struct {
	// URI is the libvirt connection URI (default qemu:///system). Only
	// local unix-socket URIs are accepted: overlays and forwarded ports
	// live on this host. "qemu+unix:///system?socket=PATH" names another
	// socket.
	URI string
	// NamePrefix starts the name of every domain, overlay and console log
	// (default "legato-"). Sweep removes everything with the prefix, so
	// runs that share a host at the same time need different prefixes.
	NamePrefix string
	// BaseImage is the qcow2 image every VM's overlay is backed by. It is
	// only ever read.
	BaseImage string
	// Kernel, Initrd and Cmdline boot a kernel directly (legato's test
	// guest) instead of from the disk with the BIOS (OSWorld's images).
	// Initrd and Cmdline need Kernel.
	Kernel, Initrd, Cmdline string
	// VCPUs (default 4) and MemoryMiB (default 4096) size each VM.
	VCPUs     int
	MemoryMiB int
	// Accel chooses KVM or software emulation (default auto).
	Accel Accel
	// OverlayDir holds the overlays and console logs (default
	// /var/tmp/legato). QEMU runs as libvirt-qemu, so it must be reachable
	// by other users (not under /root).
	OverlayDir string
	// CallTimeout bounds every libvirt call and every qemu-img run
	// (default 60s).
	CallTimeout time.Duration
	// BootTimeout bounds the wait for the guest server after a boot or a
	// revert (default 5m; software emulation boots slowly, more so with
	// several VMs starting together).
	BootTimeout time.Duration
	// ReadyTry bounds one readiness probe (default 2s). QEMU accepts TCP on
	// a forwarded port before the guest listens and then leaves the
	// connection hanging, so each probe needs its own short bound.
	ReadyTry time.Duration
	// GuestPort, DevToolsPort and VLCPort are the guest-side ports of the
	// OSWorld guest server (default 5000), Chrome DevTools (9222) and VLC's
	// HTTP interface (8080), each forwarded from a free host port.
	GuestPort, DevToolsPort, VLCPort int
	// Ready probes the guest server. Nil means: any HTTP answer on the
	// forwarded guest port.
	Ready ReadyFunc
	// QemuImg is the qemu-img program (default "qemu-img" on PATH).
	QemuImg string
	// Logger receives the lifecycle events (default: discard).
	Logger *slog.Logger
}

var namePrefixRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.URI == "" {
		c.URI = DefaultURI
	}
	if c.NamePrefix == "" {
		c.NamePrefix = DefaultNamePrefix
	}
	if c.VCPUs == 0 {
		c.VCPUs = DefaultVCPUs
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = DefaultMemoryMiB
	}
	if c.Accel == "" {
		c.Accel = AccelAuto
	}
	if c.OverlayDir == "" {
		c.OverlayDir = DefaultOverlayDir
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = DefaultBootTimeout
	}
	if c.ReadyTry == 0 {
		c.ReadyTry = DefaultReadyTry
	}
	if c.GuestPort == 0 {
		c.GuestPort = DefaultGuestPort
	}
	if c.DevToolsPort == 0 {
		c.DevToolsPort = DefaultDevToolsPort
	}
	if c.VLCPort == 0 {
		c.VLCPort = DefaultVLCPort
	}
	if c.QemuImg == "" {
		c.QemuImg = "qemu-img"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports what is wrong with the configuration, with its zero
// fields taken as their defaults: each error names the field and what to
// do. It also checks that the files exist and that QEMU, which runs as
// another user, can reach them.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if _, err := socketPath(c.URI); err != nil {
		errs = append(errs, err)
	}
	if !namePrefixRE.MatchString(c.NamePrefix) {
		bad("name prefix %q: use letters, digits, '-', '_' or '.', starting with a letter or digit", c.NamePrefix)
	}
	if c.BaseImage == "" {
		bad("base image: not set; give the qcow2 image the VMs start from")
	} else if err := checkReadable("base image", c.BaseImage); err != nil {
		errs = append(errs, err)
	}
	if c.Kernel == "" {
		if c.Initrd != "" || c.Cmdline != "" {
			bad("initrd and kernel command line need a kernel: set the kernel too, or neither to boot from the disk")
		}
	} else {
		if err := checkReadable("kernel", c.Kernel); err != nil {
			errs = append(errs, err)
		}
		if c.Initrd != "" {
			if err := checkReadable("initrd", c.Initrd); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.VCPUs < 1 || c.VCPUs > 256 {
		bad("vcpus %d: want 1 to 256", c.VCPUs)
	}
	if c.MemoryMiB < 256 {
		bad("memory %d MiB: want at least 256", c.MemoryMiB)
	}
	switch c.Accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		bad("accel %q: want auto, kvm or tcg", c.Accel)
	}
	if !filepath.IsAbs(c.OverlayDir) {
		bad("overlay dir %q: want an absolute path", c.OverlayDir)
	} else if err := checkTraversable("overlay dir", c.OverlayDir); err != nil {
		errs = append(errs, err)
	}
	if c.CallTimeout < 0 || c.BootTimeout < 0 || c.ReadyTry < 0 {
		bad("timeouts must not be negative")
	}
	ports := map[int]string{}
	for _, p := range []struct {
		name string
		port int
	}{{"guest port", c.GuestPort}, {"devtools port", c.DevToolsPort}, {"vlc port", c.VLCPort}} {
		if p.port < 1 || p.port > 65535 {
			bad("%s %d: want 1 to 65535", p.name, p.port)
			continue
		}
		if other, dup := ports[p.port]; dup {
			bad("%s %d: same as the %s", p.name, p.port, other)
		}
		ports[p.port] = p.name
	}
	return errors.Join(errs...)
}

// socketPath returns the unix socket a URI is reached through. Remote
// transports are refused: overlays are created and ports forwarded on this
// host, so the domains must run here too.
func socketPath(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("libvirt uri %q: %w", uri, err)
	}
	if (u.Scheme != "qemu" && u.Scheme != "qemu+unix") || u.Host != "" || u.Opaque != "" {
		return "", fmt.Errorf("libvirt uri %q: want a local qemu URI such as qemu:///system (the VMs' disks and ports must be on this host)", uri)
	}
	if s := u.Query().Get("socket"); s != "" {
		return s, nil
	}
	if u.Path != "/system" {
		return "", fmt.Errorf("libvirt uri %q: only qemu:///system has a known socket; add ?socket=PATH", uri)
	}
	return DefaultSocket, nil
}

// checkReadable reports a missing file, and a path QEMU (running as
// libvirt-qemu) cannot reach because a parent directory is closed to
// other users. libvirt itself gives the files to libvirt-qemu, but it does
// not open up their directories.
func checkReadable(what, path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s %q: want an absolute path", what, path)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s %q: %w", what, path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s %q: not a regular file", what, path)
	}
	return checkTraversable(what, filepath.Dir(path))
}

// checkTraversable reports the first existing directory on path that other
// users cannot enter. Directories that do not exist yet are created later
// with mode 0755.
func checkTraversable(what, path string) error {
	for dir := filepath.Clean(path); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err == nil && st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s: directory %q is closed to other users (mode %v); QEMU runs as another user (libvirt-qemu): move the file, e.g. under /var/tmp", what, dir, st.Mode().Perm())
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if dir == "/" || dir == "." {
			return nil
		}
	}
}
