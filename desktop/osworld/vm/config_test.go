package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	// QEMU runs as another user: the test's directories must be open to
	// others, as t.TempDir's are not.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := filepath.Join(dir, "base.qcow2")
	kernel := filepath.Join(dir, "vmlinux")
	for _, p := range []string{base, kernel} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	closed := filepath.Join(dir, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	hidden := filepath.Join(closed, "base.qcow2")
	if err := os.WriteFile(hidden, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok := Config{BaseImage: base, OverlayDir: filepath.Join(dir, "overlays")}
	with := func(f func(*Config)) Config { c := ok; f(&c); return c }

	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" means valid; else a substring of the error
	}{
		{"defaults", ok, ""},
		{"direct boot", with(func(c *Config) { c.Kernel, c.Cmdline = kernel, "quiet" }), ""},
		{"socket uri", with(func(c *Config) { c.URI = "qemu+unix:///system?socket=/tmp/s" }), ""},
		{"no base image", with(func(c *Config) { c.BaseImage = "" }), "base image: not set"},
		{"missing base image", with(func(c *Config) { c.BaseImage = filepath.Join(dir, "nope.qcow2") }), "no such file"},
		{"relative base image", with(func(c *Config) { c.BaseImage = "base.qcow2" }), "absolute path"},
		{"base image behind a closed dir", with(func(c *Config) { c.BaseImage = hidden }), "closed to other users"},
		{"cmdline without kernel", with(func(c *Config) { c.Cmdline = "quiet" }), "need a kernel"},
		{"remote uri", with(func(c *Config) { c.URI = "qemu+ssh://host/system" }), "local qemu URI"},
		{"session uri without socket", with(func(c *Config) { c.URI = "qemu:///session" }), "?socket="},
		{"empty-looking prefix", with(func(c *Config) { c.NamePrefix = "-" }), "name prefix"},
		{"prefix with slash", with(func(c *Config) { c.NamePrefix = "a/b" }), "name prefix"},
		{"bad accel", with(func(c *Config) { c.Accel = "hvf" }), "accel"},
		{"too little memory", with(func(c *Config) { c.MemoryMiB = 64 }), "memory"},
		{"negative vcpus", with(func(c *Config) { c.VCPUs = -1 }), "vcpus"},
		{"same guest ports", with(func(c *Config) { c.VLCPort = 5000 }), "same as the guest port"},
		{"relative overlay dir", with(func(c *Config) { c.OverlayDir = "tmp" }), "overlay dir"},
		{"negative timeout", with(func(c *Config) { c.BootTimeout = -1 }), "negative"},
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

func TestVMFileName(t *testing.T) {
	for _, tt := range []struct {
		file, name string
		ok         bool
	}{
		{"legato-0-ab.qcow2", "legato-0-ab", true},
		{"legato-0-ab.console.log", "legato-0-ab", true},
		{"legato-.qcow2", "", false},
		{"legato-0-ab.xml", "", false},
		{"other-0.qcow2", "", false},
	} {
		name, ok := vmFileName(tt.file, "legato-")
		if name != tt.name || ok != tt.ok {
			t.Errorf("vmFileName(%q) = %q, %v; want %q, %v", tt.file, name, ok, tt.name, tt.ok)
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
