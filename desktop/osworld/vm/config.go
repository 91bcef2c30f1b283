package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	DefaultStoragePool  = "legato"
	DefaultPoolDir      = "/var/lib/libvirt/images/legato"
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
	// Hosts are the libvirt hosts the VMs run on (default: this machine's
	// qemu:///system, with no cap). Start uses the first; a pool of
	// desktops spreads its VMs over all of them.
	Hosts []HostSpec
	// SSH says how to log in to qemu+ssh hosts.
	SSH SSHConfig
	// NamePrefix starts the name of every domain, overlay and console log
	// (default "legato-"). Sweep removes everything with the prefix, so
	// runs that share a host at the same time need different prefixes.
	NamePrefix string
	// BaseImage is the local qcow2 image every VM's overlay is backed by.
	// Each host holds it as a volume of its storage pool (SyncImages
	// uploads it); it is only ever read.
	BaseImage string
	// Kernel, Initrd and Cmdline boot a kernel directly (legato's test
	// guest) instead of from the disk with the BIOS (OSWorld's images).
	// Initrd and Cmdline need Kernel. The kernel and initrd are local
	// files held by each host as volumes, like the base image.
	Kernel, Initrd, Cmdline string
	// VCPUs (default 4) and MemoryMiB (default 4096) size each VM.
	VCPUs     int
	MemoryMiB int
	// Accel chooses KVM or software emulation (default auto: on this
	// machine, KVM where it really works; on a remote host, KVM).
	Accel Accel
	// StoragePool is the libvirt storage pool, on every host, of the image
	// files, overlays and console logs (default "legato"). SyncImages
	// creates it as a directory pool at PoolDir (default
	// /var/lib/libvirt/images/legato) on a host that has none.
	StoragePool string
	PoolDir     string
	// HashCache keeps the image files' hashes between runs, keyed by path,
	// size and modification time (default legato/image-sums.json in the
	// user's cache directory; "-" keeps none).
	HashCache string
	// CallTimeout bounds every libvirt call other than an image upload
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
	// Fork starts the VMs ready for VM.Template: guest RAM is shared
	// memory (a memfd) that a template can copy while the guest is
	// paused. Only VMs on this machine can be forked.
	Fork bool
	// ForkDir is where templates and their clones keep their files
	// (default /dev/shm/legato-fork), on every host. It should be tmpfs
	// or hugetlbfs: clones map the template's guest RAM from there.
	ForkDir string
	// BootCache is a directory where the clean state of a VM's boot is
	// kept, so that later VMs of the same machine and base image start
	// from it in a few seconds instead of booting (see bootcache.go).
	// Empty: every VM boots. Only VMs on this machine use it; entries
	// stay between runs until their image is gone or they fail to load.
	BootCache string
	// BootCacheKey is what the guest's clean state depends on beyond the
	// machine and the image: the configuration of what Ready puts in the
	// guest before the clean snapshot. It is part of the entry's key.
	BootCacheKey string
	// HostAgent is the legato program on remote hosts that forks their
	// VMs there (`legato rl host-agent`, started over SSH; package
	// hostagent). Empty: legato, found on the PATH of the SSH user.
	HostAgent string
	// Logger receives the lifecycle events (default: discard).
	Logger *slog.Logger
}

var namePrefixRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if len(c.Hosts) == 0 {
		c.Hosts = []HostSpec{{URI: DefaultURI}}
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
	if c.StoragePool == "" {
		c.StoragePool = DefaultStoragePool
	}
	if c.PoolDir == "" {
		c.PoolDir = DefaultPoolDir
	}
	switch c.HashCache {
	case "":
		if dir, err := os.UserCacheDir(); err == nil {
			c.HashCache = filepath.Join(dir, "legato", "image-sums.json")
		}
	case "-":
		c.HashCache = ""
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
	if c.ForkDir == "" {
		c.ForkDir = DefaultForkDir
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports what is wrong with the configuration, with its zero
// fields taken as their defaults: each error names the field and what to
// do. It also checks that the image files exist.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if err := checkHostSpecs(c.Hosts); err != nil {
		errs = append(errs, err)
	}
	if !namePrefixRE.MatchString(c.NamePrefix) {
		bad("name prefix %q: use letters, digits, '-', '_' or '.', starting with a letter or digit", c.NamePrefix)
	}
	if c.BaseImage == "" {
		bad("base image: not set; give the qcow2 image the VMs start from")
	} else if err := checkFile("base image", c.BaseImage); err != nil {
		errs = append(errs, err)
	}
	if c.Kernel == "" {
		if c.Initrd != "" || c.Cmdline != "" {
			bad("initrd and kernel command line need a kernel: set the kernel too, or neither to boot from the disk")
		}
	} else {
		if err := checkFile("kernel", c.Kernel); err != nil {
			errs = append(errs, err)
		}
		if c.Initrd != "" {
			if err := checkFile("initrd", c.Initrd); err != nil {
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
	if !poolNameRE.MatchString(c.StoragePool) {
		bad("storage pool %q: use letters, digits, '-', '_' or '.'", c.StoragePool)
	}
	if !filepath.IsAbs(c.PoolDir) {
		bad("pool dir %q: want an absolute path (on the hosts)", c.PoolDir)
	}
	if !filepath.IsAbs(c.ForkDir) {
		bad("fork dir %q: want an absolute path", c.ForkDir)
	}
	if c.BootCache != "" {
		if !filepath.IsAbs(c.BootCache) {
			bad("boot cache %q: want an absolute path", c.BootCache)
		} else if info, err := os.Stat(c.BootCache); err == nil && !info.IsDir() {
			bad("boot cache %q: not a directory; give a directory (made if missing)", c.BootCache)
		}
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

var poolNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// checkFile reports a missing image file, or one that is not a regular
// file. The hosts hold copies (volumes): QEMU never reads it here.
func checkFile(what, path string) error {
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
	return nil
}
