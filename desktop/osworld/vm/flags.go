package vm

import (
	"flag"
	"fmt"
)

// UnmarshalText sets a from "auto", "kvm" or "tcg" (flag.TextVar uses it).
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

// AddFlags binds c's fields to command-line flags on fs (--libvirt-uri,
// --base-image, --vcpus, --accel, ...), with c's current values, or the
// defaults where those are zero, as the flags' defaults.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	d := c.withDefaults()
	*c = Config{
		URI: d.URI, NamePrefix: d.NamePrefix, BaseImage: c.BaseImage,
		Kernel: c.Kernel, Initrd: c.Initrd, Cmdline: c.Cmdline,
		VCPUs: d.VCPUs, MemoryMiB: d.MemoryMiB, Accel: d.Accel, OverlayDir: d.OverlayDir,
		CallTimeout: d.CallTimeout, BootTimeout: d.BootTimeout, ReadyTry: c.ReadyTry,
		GuestPort: d.GuestPort, DevToolsPort: d.DevToolsPort, VLCPort: d.VLCPort,
		Ready: c.Ready, QemuImg: c.QemuImg, Logger: c.Logger,
	}
	fs.StringVar(&c.URI, "libvirt-uri", c.URI, "libvirt connection `URI` (local only; qemu+unix:///system?socket=PATH for another socket)")
	fs.StringVar(&c.NamePrefix, "vm-prefix", c.NamePrefix, "name `prefix` of the VMs' domains and overlays; gc removes everything with it")
	fs.StringVar(&c.BaseImage, "base-image", c.BaseImage, "qcow2 `image` the VMs' overlays are backed by (only read)")
	fs.StringVar(&c.Kernel, "kernel", c.Kernel, "boot this kernel `file` directly instead of from the disk")
	fs.StringVar(&c.Initrd, "initrd", c.Initrd, "initrd `file` for --kernel")
	fs.StringVar(&c.Cmdline, "kernel-cmdline", c.Cmdline, "kernel command `line` for --kernel")
	fs.IntVar(&c.VCPUs, "vcpus", c.VCPUs, "virtual CPUs per VM")
	fs.IntVar(&c.MemoryMiB, "memory-mib", c.MemoryMiB, "memory per VM in `MiB`")
	fs.TextVar(&c.Accel, "accel", c.Accel, "auto, kvm or tcg (software emulation); auto uses KVM only where it really works")
	fs.StringVar(&c.OverlayDir, "overlay-dir", c.OverlayDir, "`directory` for the VMs' overlays (must be reachable by the libvirt-qemu user)")
	fs.DurationVar(&c.CallTimeout, "libvirt-timeout", c.CallTimeout, "bound on each libvirt call")
	fs.DurationVar(&c.BootTimeout, "boot-timeout", c.BootTimeout, "bound on the wait for the guest server after a boot or a revert")
}
