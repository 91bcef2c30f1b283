package vm

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestAddFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want Config
	}{
		{"defaults", nil, Config{
			URI: DefaultURI, NamePrefix: DefaultNamePrefix, VCPUs: DefaultVCPUs, MemoryMiB: DefaultMemoryMiB,
			Accel: AccelAuto, OverlayDir: DefaultOverlayDir, CallTimeout: DefaultCallTimeout, BootTimeout: DefaultBootTimeout,
			GuestPort: DefaultGuestPort, DevToolsPort: DefaultDevToolsPort, VLCPort: DefaultVLCPort,
		}},
		{"all set", []string{"--libvirt-uri", "qemu+unix:///system?socket=/s", "--vm-prefix", "run7-",
			"--base-image", "/img/base.qcow2", "--kernel", "/img/vmlinux", "--initrd", "/img/initrd.img",
			"--kernel-cmdline", "quiet", "--vcpus", "2", "--memory-mib", "2048", "--accel", "tcg",
			"--overlay-dir", "/var/tmp/x", "--libvirt-timeout", "5s", "--boot-timeout", "10m"}, Config{
			URI: "qemu+unix:///system?socket=/s", NamePrefix: "run7-", BaseImage: "/img/base.qcow2",
			Kernel: "/img/vmlinux", Initrd: "/img/initrd.img", Cmdline: "quiet", VCPUs: 2, MemoryMiB: 2048,
			Accel: AccelTCG, OverlayDir: "/var/tmp/x", CallTimeout: 5 * time.Second, BootTimeout: 10 * time.Minute,
			GuestPort: DefaultGuestPort, DevToolsPort: DefaultDevToolsPort, VLCPort: DefaultVLCPort,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			c.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, c, cmpopts.IgnoreFields(Config{}, "Ready", "Logger")); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAccelFlagRejectsUnknown(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.AddFlags(fs)
	if err := fs.Parse([]string{"--accel", "hvf"}); err == nil {
		t.Fatal("--accel hvf: want an error")
	}
}
