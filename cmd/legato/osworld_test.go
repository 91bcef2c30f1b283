package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
)

// testImageDir makes a directory like the one build.sh writes: base.qcow2,
// vmlinux, initrd.img and cmdline, readable by QEMU's user.
func testImageDir(t *testing.T) string {
	t.Helper()
	img := t.TempDir()
	for _, d := range []string{filepath.Dir(img), img} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"base.qcow2", "vmlinux", "initrd.img"} {
		if err := os.WriteFile(filepath.Join(img, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(img, "cmdline"), []byte("root=/dev/vda quiet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

func parseOSWorld(args []string) (osworld.Config, error) {
	var f osworldFlags
	fs := flag.NewFlagSet("collect", flag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	f.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return osworld.Config{}, err
	}
	return f.Config(nil)
}

func TestOSWorldFlags(t *testing.T) {
	img := testImageDir(t)
	osw := t.TempDir()
	vmDefaults := vm.Config{NamePrefix: vm.DefaultNamePrefix, VCPUs: vm.DefaultVCPUs,
		MemoryMiB: vm.DefaultMemoryMiB, Accel: vm.AccelAuto, StoragePool: vm.DefaultStoragePool}
	tests := []struct {
		name string
		args []string
		env  string
		want osworld.Config
	}{
		{
			name: "test guest directory",
			args: []string{"--image", img, "--vcpus", "2", "--memory", "1536", "--accel", "tcg", "--no-fast-reset", "--boot-timeout", "90",
				"--host", "qemu:///system,desktops=2", "--host", "qemu+ssh://root@10.0.0.7/system,desktops=16", "--storage-pool", "images", "--no-golden", "--golden-max", "2"},
			want: osworld.Config{
				VM: vm.Config{Hosts: []vm.HostSpec{{URI: "qemu:///system", Desktops: 2}, {URI: "qemu+ssh://root@10.0.0.7/system", Desktops: 16}},
					NamePrefix: vm.DefaultNamePrefix, BaseImage: filepath.Join(img, "base.qcow2"),
					Kernel: filepath.Join(img, "vmlinux"), Initrd: filepath.Join(img, "initrd.img"), Cmdline: "root=/dev/vda quiet",
					VCPUs: 2, MemoryMiB: 1536, Accel: vm.AccelTCG, StoragePool: "images"},
				BootTimeout: 90 * time.Second,
				NoFastReset: true,
				Golden:      osworld.GoldenConfig{Off: true, Max: 2},
				Grade:       osworld.GradeConfig{Python: grade.DefaultPython, Mode: grade.NativeOnly},
			},
		},
		{
			name: "guests with osworld",
			args: []string{"--guest-url", "http://127.0.0.1:5000,devtools=9222", "--guest-url", "http://127.0.0.1:5001", "--osworld", osw, "--grader", "native", "--boot-timeout", "10s", "--grade-workers", "3",
				"--guest-dedicated", "--guest-root-desktop"},
			env: "hunter2",
			want: osworld.Config{
				VM:             vmDefaults,
				Guests:         []osworld.GuestAddr{{URL: "http://127.0.0.1:5000", DevToolsPort: 9222}, {URL: "http://127.0.0.1:5001"}},
				FastReset:      osworld.FastResetConfig{Dedicated: true, RootDesktop: true},
				BootTimeout:    10 * time.Second,
				Golden:         osworld.GoldenConfig{Max: osworld.DefaultGoldenMax},
				Grade:          osworld.GradeConfig{OSWorldDir: osw, Python: grade.DefaultPython, Mode: grade.PreferNative, Workers: 3},
				ClientPassword: "hunter2",
			},
		},
		{
			name: "hosts from DNS",
			args: []string{"--image", img, "--hosts-from", "dns:legato-hosts.legato.svc.cluster.local,user=root,desktops=4,every=10s"},
			want: osworld.Config{
				VM: vm.Config{NamePrefix: vm.DefaultNamePrefix, BaseImage: filepath.Join(img, "base.qcow2"),
					Kernel: filepath.Join(img, "vmlinux"), Initrd: filepath.Join(img, "initrd.img"), Cmdline: "root=/dev/vda quiet",
					VCPUs: vm.DefaultVCPUs, MemoryMiB: vm.DefaultMemoryMiB, Accel: vm.AccelAuto, StoragePool: vm.DefaultStoragePool},
				HostsFrom:   &hostdns.Source{Name: "legato-hosts.legato.svc.cluster.local", User: "root", Desktops: 4, Every: 10 * time.Second},
				BootTimeout: osworld.DefaultBootTimeout,
				Golden:      osworld.GoldenConfig{Max: osworld.DefaultGoldenMax},
				Grade:       osworld.GradeConfig{Python: grade.DefaultPython, Mode: grade.NativeOnly},
			},
		},
		{
			name: "what a fast reset restores and checks",
			args: []string{"--image", img, "--fast-reset-restore", "/srv/data", "--fast-reset-restore", "/var/games",
				"--fast-reset-check", "/var/lib/flatpak", "--ready-compare-screenshots", "--no-executor", "--golden-refuse", "t1", "--golden-refuse", "t2",
				"--golden-fork", "--fork-dir", "/dev/hugepages/legato", "--boot-cache", "/var/cache/legato/boot"},
			want: osworld.Config{
				VM: vm.Config{NamePrefix: vm.DefaultNamePrefix, BaseImage: filepath.Join(img, "base.qcow2"), ForkDir: "/dev/hugepages/legato",
					BootCache: "/var/cache/legato/boot",
					Kernel:    filepath.Join(img, "vmlinux"), Initrd: filepath.Join(img, "initrd.img"), Cmdline: "root=/dev/vda quiet",
					VCPUs: vm.DefaultVCPUs, MemoryMiB: vm.DefaultMemoryMiB, Accel: vm.AccelAuto, StoragePool: vm.DefaultStoragePool},
				BootTimeout: osworld.DefaultBootTimeout,
				FastReset: osworld.FastResetConfig{
					Restore: append(osworld.DefaultRestoreDirs(), "/srv/data", "/var/games"),
					Check:   append(osworld.DefaultCheckDirs(), "/var/lib/flatpak"),
				},
				NoExecutor: true,
				Ready:      osworld.ReadyConfig{NoDamage: true},
				Golden:     osworld.GoldenConfig{Max: osworld.DefaultGoldenMax, Refuse: []string{"t1", "t2"}, Fork: true},
				Grade:      osworld.GradeConfig{Python: grade.DefaultPython, Mode: grade.NativeOnly},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(osworld.PasswordEnv, tt.env)
			cfg, err := parseOSWorld(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, cfg, cmpopts.IgnoreFields(vm.Config{}, "Logger")); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOSWorldFlagErrors: every bad value is a usage error that names the
// flag, found before a pool (or a VM) is made.
func TestOSWorldFlagErrors(t *testing.T) {
	img := testImageDir(t)
	guest := []string{"--guest-url", "http://127.0.0.1:5000"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"bridge without checkout", append(guest, "--grader", "bridge"), "--osworld"},
		{"bad grader", append(guest, "--grader", "magic"), `invalid value "magic" for flag -grader: want auto, bridge, native or native-only`},
		{"bad accel", append(guest, "--accel", "hvf"), `invalid value "hvf" for flag -accel`},
		{"image and guests", append(guest, "--image", img), "choose"},
		{"missing image", []string{"--image", filepath.Join(img, "none.qcow2")}, "--image"},
		{"bad guest url", []string{"--guest-url", "localhost:5000"}, "http://HOST:PORT"},
		{"guest url port", []string{"--guest-url", "http://127.0.0.1:99999"}, "port"},
		{"devtools port", []string{"--guest-url", "http://127.0.0.1:5000,devtools=0"}, "devtools=PORT"},
		{"vlc port", []string{"--guest-url", "http://127.0.0.1:5000,vlc=70000"}, "vlc=PORT"},
		{"nothing", nil, "no desktops"},
		// Numbers are checked whether or not VMs are started here.
		{"vcpus zero", append(guest, "--vcpus", "0"), `invalid value "0" for flag -vcpus: want an integer from 1 to 256`},
		{"vcpus negative", append(guest, "--vcpus", "-3"), "-vcpus"},
		{"memory small", append(guest, "--memory", "100"), `invalid value "100" for flag -memory: want an integer from 256 to 1048576`},
		{"memory not a number", append(guest, "--memory", "4G"), "-memory"},
		{"boot timeout zero", append(guest, "--boot-timeout", "0"), `invalid value "0" for flag -boot-timeout: want from 1s to 24h, as seconds (60) or a duration with units (1m30s)`},
		{"boot timeout negative", append(guest, "--boot-timeout", "-10s"), "-boot-timeout"},
		{"grade workers", append(guest, "--grade-workers", "-1"), `invalid value "-1" for flag -grade-workers: want an integer from 0 to 64`},
		{"bad vm prefix", []string{"--image", img, "--vm-prefix", "../x"}, "name prefix"},
		{"bad host", []string{"--image", img, "--host", "qemu+ssh://h/system?no_verify=1"}, `invalid value "qemu+ssh://h/system?no_verify=1" for flag -host`},
		{"host desktops", []string{"--image", img, "--host", "qemu:///system,desktops=0"}, "desktops=0"},
		{"same host twice", []string{"--image", img, "--host", "qemu+ssh://h/system", "--host", "qemu+ssh://h/system"}, "give each its own name"},
		{"bad hosts from", []string{"--image", img, "--hosts-from", "legato-hosts"}, `invalid value "legato-hosts" for flag -hosts-from: hosts from "legato-hosts": want dns:NAME[:PORT]`},
		{"hosts from twice", []string{"--image", img, "--hosts-from", "dns:a", "--hosts-from", "dns:b"}, "given twice (dns:a, then dns:b)"},
		{"host and hosts from", []string{"--image", img, "--host", "qemu:///system", "--hosts-from", "dns:a"}, "--host and --hosts-from dns:a: give the hosts one way"},
		{"guests and hosts from", append(guest, "--hosts-from", "dns:a"), "HostsFrom (--hosts-from) names libvirt hosts, and Guests (--guest-url) guests that already run: choose one"},
		{"restore relative", append(guest, "--fast-reset-restore", "tmp"), `FastReset.Restore (--fast-reset-restore): "tmp"`},
		{"restore the home", append(guest, "--fast-reset-restore", "/home"), "overlaps Home"},
		{"fork without golden", []string{"--image", img, "--golden-fork", "--no-golden"}, "Golden.Fork (--golden-fork) forks golden states, which Golden.Off (--no-golden) turns off"},
		{"fork a guest url", append(guest, "--golden-fork"), "guests given by URL cannot fork"},
		{"dedicated without guests", []string{"--image", img, "--guest-dedicated"}, "--guest-dedicated speaks of --guest-url guests"},
		{"root desktop without guests", []string{"--image", img, "--guest-root-desktop"}, "--guest-root-desktop speaks of --guest-url guests"},
		{"fork dir relative", []string{"--image", img, "--golden-fork", "--fork-dir", "shm"}, `fork dir "shm": want an absolute path`},
		{"boot cache relative", []string{"--image", img, "--boot-cache", "boot"}, `boot cache "boot": want an absolute path`},
		{"boot cache a file", []string{"--image", img, "--boot-cache", filepath.Join(img, "vmlinux")}, "not a directory"},
		{"golden max zero", append(guest, "--golden-max", "0"), `invalid value "0" for flag -golden-max: want an integer from 1 to 1000`},
		{"check not clean", append(guest, "--fast-reset-check", "/etc/"), `FastReset.Check (--fast-reset-check): "/etc/"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseOSWorld(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("flags %q: %v; want an error containing %q", tt.args, err, tt.wantErr)
			}
			var u *usageError
			if !errors.As(err, &u) {
				t.Errorf("flags %q: %v is not a usage error", tt.args, err)
			}
		})
	}
}

// TestGCFlags: gc lists and takes only its own six flags, not the many of
// the osworld backend.
func TestGCFlags(t *testing.T) {
	var stderr bytes.Buffer
	err := new(gcCommand).Run(t.Context(), []string{"-h"}, &bytes.Buffer{}, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("gc -h = %v, want flag.ErrHelp", err)
	}
	var listed []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "  -") {
			listed = append(listed, strings.Fields(line)[0])
		}
	}
	if diff := cmp.Diff([]string{"-end-states", "-fork-dir", "-host", "-host-agent", "-hosts-from", "-storage-pool", "-vm-prefix"}, listed); diff != "" {
		t.Errorf("gc -h flags (-want +got):\n%s", diff)
	}
	err = new(gcCommand).Run(t.Context(), []string{"--image", "x.qcow2"}, &bytes.Buffer{}, &bytes.Buffer{})
	var u *usageError
	if !errors.As(err, &u) {
		t.Errorf("gc --image = %v, want a usage error", err)
	}
}
