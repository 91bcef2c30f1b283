package vm

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	kernel := filepath.Join(dir, "vmlinux")
	for _, p := range []string{base, kernel} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ok := Config{BaseImage: base}
	with := func(f func(*Config)) Config { c := ok; f(&c); return c }
	ssh := HostSpec{URI: "qemu+ssh://root@10.0.0.1/system"}

	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" means valid; else a substring of the error
	}{
		{"defaults", ok, ""},
		{"direct boot", with(func(c *Config) { c.Kernel, c.Cmdline = kernel, "quiet" }), ""},
		{"socket uri", with(func(c *Config) { c.Hosts = []HostSpec{{URI: "qemu+unix:///system?socket=/tmp/s"}} }), ""},
		{"ssh and local hosts", with(func(c *Config) { c.Hosts = []HostSpec{ssh, {URI: DefaultURI, Desktops: 2}} }), ""},
		{"no base image", with(func(c *Config) { c.BaseImage = "" }), "base image: not set"},
		{"missing base image", with(func(c *Config) { c.BaseImage = filepath.Join(dir, "nope.qcow2") }), "no such file"},
		{"relative base image", with(func(c *Config) { c.BaseImage = "base.qcow2" }), "absolute path"},
		{"base image is a directory", with(func(c *Config) { c.BaseImage = dir }), "not a regular file"},
		{"cmdline without kernel", with(func(c *Config) { c.Cmdline = "quiet" }), "need a kernel"},
		{"bad host", with(func(c *Config) { c.Hosts = []HostSpec{{URI: "xen:///system"}} }), "driver \"xen\""},
		{"same host twice", with(func(c *Config) { c.Hosts = []HostSpec{ssh, ssh} }), "give each its own name"},
		{"session uri without socket", with(func(c *Config) { c.Hosts = []HostSpec{{URI: "qemu:///session"}} }), "?socket="},
		{"empty-looking prefix", with(func(c *Config) { c.NamePrefix = "-" }), "name prefix"},
		{"prefix with slash", with(func(c *Config) { c.NamePrefix = "a/b" }), "name prefix"},
		{"bad accel", with(func(c *Config) { c.Accel = "hvf" }), "accel"},
		{"too little memory", with(func(c *Config) { c.MemoryMiB = 64 }), "memory"},
		{"negative vcpus", with(func(c *Config) { c.VCPUs = -1 }), "vcpus"},
		{"same guest ports", with(func(c *Config) { c.VLCPort = 5000 }), "same as the guest port"},
		{"bad pool name", with(func(c *Config) { c.StoragePool = "a b" }), "storage pool"},
		{"relative pool dir", with(func(c *Config) { c.PoolDir = "images" }), "pool dir"},
		{"negative timeout", with(func(c *Config) { c.BootTimeout = -1 }), "negative"},
		{"relative boot cache", with(func(c *Config) { c.BootCache = "boot" }), "boot cache \"boot\": want an absolute path"},
		{"boot cache is a file", with(func(c *Config) { c.BootCache = base }), "not a directory"},
		{"boot cache made when missing", with(func(c *Config) { c.BootCache = filepath.Join(dir, "boot") }), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("Validate: nil, want an error with %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("Validate: %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}

func TestVMNames(t *testing.T) {
	names := vmNames("legato-")
	for _, tt := range []struct {
		vol, name string
		ok        bool
	}{
		{"legato-0-0123abcd.qcow2", "legato-0-0123abcd", true},
		{"legato-12-0123abcd.qcow2", "legato-12-0123abcd", true},
		{"legato-0-0123abcd", "", false},                  // no volume suffix
		{"legato-0-0123abcd.xml", "", false},              // not a VM's volume
		{"legato-0-0123ABCD.qcow2", "", false},            // Start writes lower-case hex
		{"legato-0-ab.qcow2", "", false},                  // too short a suffix
		{"legato-it-0-0123abcd.qcow2", "", false},         // another prefix that starts with this one
		{"legato-base-0123456789abcdef.qcow2", "", false}, // an image file
		{"legato-kernel-0123456789abcdef", "", false},
		{"other-0-0123abcd.qcow2", "", false},
	} {
		name, ok := vmOfVolume(tt.vol, names)
		if name != tt.name || ok != tt.ok {
			t.Errorf("vmOfVolume(%q) = %q, %v; want %q, %v", tt.vol, name, ok, tt.name, tt.ok)
		}
	}
	// The prefix is taken literally.
	if vmNames("a.b-").MatchString("axb-0-0123abcd") {
		t.Error(`prefix "a.b-" matched "axb-0-0123abcd": the dot must be literal`)
	}
}

func TestImageVolumeNames(t *testing.T) {
	sum := strings.Repeat("0123456789abcdef", 4)
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	for _, tt := range []struct {
		f    ImageFile
		want string
	}{
		{ImageFile{Role: RoleBase, SHA256: sum}, "legato-base-0123456789abcdef.qcow2"},
		{ImageFile{Role: RoleKernel, SHA256: sum}, "legato-kernel-0123456789abcdef"},
		{ImageFile{Role: RoleInitrd, SHA256: sum}, "legato-initrd-0123456789abcdef"},
	} {
		if got := tt.f.Volume(); got != tt.want {
			t.Errorf("%s volume %q, want %q", tt.f.Role, got, tt.want)
		}
		if !re.MatchString(tt.f.Volume()) || !re.MatchString(tt.f.marker()) {
			t.Errorf("%s: volume names %q, %q are not plain file names", tt.f.Role, tt.f.Volume(), tt.f.marker())
		}
		if vmNames(DefaultNamePrefix).MatchString(strings.TrimSuffix(tt.f.Volume(), ".qcow2")) {
			t.Errorf("%s volume %q looks like a VM's: a sweep would delete it", tt.f.Role, tt.f.Volume())
		}
	}
}

func TestAccelText(t *testing.T) {
	for in, want := range map[string]Accel{"auto": AccelAuto, "kvm": AccelKVM, "tcg": AccelTCG, "": AccelAuto} {
		var a Accel
		if err := a.UnmarshalText([]byte(in)); err != nil || a != want {
			t.Errorf("UnmarshalText(%q) = %q, %v; want %q", in, a, err, want)
		}
	}
	var a Accel
	if err := a.UnmarshalText([]byte("hvf")); err == nil || !strings.Contains(err.Error(), "want auto, kvm or tcg") {
		t.Errorf("UnmarshalText(hvf) = %v, want an error listing auto, kvm and tcg", err)
	}
}
