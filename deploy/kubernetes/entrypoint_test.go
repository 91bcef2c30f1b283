package kubernetes_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/vm"
	"legato/rl/internal/childenv"
)

// The entrypoint's KVM verdicts, as the README quotes them.
const (
	kvmUsable = "KVM: /dev/kvm usable"
	kvmNone   = "no usable /dev/kvm: guests run under TCG software emulation, about 10x slower"
)

// fakeHost is the /dev, /proc and /sys the entrypoint reads, made under a
// temporary directory that it reads as / (LEGATO_HOST_ROOT).
type fakeHost struct {
	// kvm is what /dev/kvm is: "device" (a character device that opens
	// read-write, /dev/null), "dir" (what an untyped hostPath makes on a
	// node without KVM), "file", or "" (none).
	kvm string
	// pvm loads kvm_pvm (/sys/module/kvm_pvm).
	pvm bool
	// cpuinfo is /proc/cpuinfo.
	cpuinfo string
	// memKiB is MemAvailable in /proc/meminfo (0: no such line).
	memKiB int
	// cpuMax and memMax are the pod's cgroup v2 cpu.max and memory.max
	// ("": no such file, as on cgroup v1).
	cpuMax, memMax string
}

const (
	intelVMX = "processor\t: 0\nflags\t\t: fpu vme vmx sse2\nvmx flags\t: vnmi ept\n\nprocessor\t: 1\nflags\t\t: fpu vme vmx sse2\n"
	amdSVM   = "processor\t: 0\nflags\t\t: fpu svm sse2\n"
	// A CPU whose "vmx flags" line names features while its flags have no
	// vmx: the key is flags alone, as vm's hasVirtFlag reads it.
	noVirt = "processor\t: 0\nflags\t\t: fpu sse2 hypervisor\nvmx flags\t: vnmi\n"
)

func (h fakeHost) make(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"dev", "proc", "sys/module", "sys/fs/cgroup"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kvm := filepath.Join(root, "dev", "kvm")
	var err error
	switch h.kvm {
	case "device":
		err = os.Symlink("/dev/null", kvm)
	case "dir":
		err = os.Mkdir(kvm, 0o755)
	case "file":
		write("dev/kvm", "")
	}
	if err != nil {
		t.Fatal(err)
	}
	if h.pvm {
		if err := os.Mkdir(filepath.Join(root, "sys/module/kvm_pvm"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/cpuinfo", h.cpuinfo)
	meminfo := "MemTotal:       99999999 kB\nMemFree:         1000 kB\n"
	if h.memKiB > 0 {
		meminfo += fmt.Sprintf("MemAvailable:   %d kB\n", h.memKiB)
	}
	write("proc/meminfo", meminfo)
	if h.cpuMax != "" {
		write("sys/fs/cgroup/cpu.max", h.cpuMax+"\n")
	}
	if h.memMax != "" {
		write("sys/fs/cgroup/memory.max", h.memMax+"\n")
	}
	return root
}

// runEntrypoint runs host-entrypoint.sh with args under bash, with only
// the environment given (no LEGATO_POLICY_KEY or other inherited value),
// and returns its output and exit status.
func runEntrypoint(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), bash, append([]string{"host-entrypoint.sh"}, args...)...)
	cmd.Env = childenv.Minimal(env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func verdictTCG(reason string) string {
	return kvmNone + " (" + reason + "); run legato with --accel tcg"
}

func capLine(n, cpus, mib, desktopCPUs, desktopMiB int) string {
	return fmt.Sprintf("host cap: %d desktops (%d cpus, %d MiB; %d cpus, %d MiB each)", n, cpus, mib, desktopCPUs, desktopMiB)
}

// TestEntrypointCheck runs `host-entrypoint.sh --check` on fake hosts:
// the KVM verdict follows vm.DetectAccel's rule, with a /dev/kvm that is
// no openable character device counting as none, and the cap is the
// desktops that fit in the CPUs and memory the pod may use.
func TestEntrypointCheck(t *testing.T) {
	const gib = 1 << 20 // KiB
	dc, dm := vm.DefaultVCPUs, vm.DefaultMemoryMiB
	for _, tc := range []struct {
		name  string
		host  fakeHost
		env   []string // besides LEGATO_HOST_ROOT and LEGATO_HOST_DIR
		lines []string // stdout, without the "legato-host: " prefix
	}{
		{
			name:  "KVM, bound by CPUs, legato's desktop size by default",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 20 * dm * 1024},
			env:   []string{"LEGATO_NPROC=" + strconv.Itoa(3*dc+1)},
			lines: []string{kvmUsable, capLine(3, 3*dc+1, 20*dm, dc, dm)},
		},
		{
			name:  "AMD's svm, bound by memory",
			host:  fakeHost{kvm: "device", cpuinfo: amdSVM, memKiB: 10*gib + 512},
			env:   []string{"LEGATO_NPROC=64", "LEGATO_DESKTOP_CPUS=4", "LEGATO_DESKTOP_MEM_MIB=4096"},
			lines: []string{kvmUsable, capLine(2, 64, 10240, 4, 4096)},
		},
		{
			name:  "no /dev/kvm",
			host:  fakeHost{cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048"},
			lines: []string{verdictTCG("/dev/kvm is absent or cannot be opened read-write"), capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "/dev/kvm an empty directory",
			host:  fakeHost{kvm: "dir", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048"},
			lines: []string{verdictTCG("/dev/kvm is absent or cannot be opened read-write"), capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "/dev/kvm a regular file",
			host:  fakeHost{kvm: "file", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048"},
			lines: []string{verdictTCG("/dev/kvm is absent or cannot be opened read-write"), capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "PVM",
			host:  fakeHost{kvm: "device", pvm: true, cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048"},
			lines: []string{verdictTCG("/dev/kvm is PVM (kvm_pvm loaded), which cannot boot ordinary guest kernels"), capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "no vmx or svm among the CPU's flags",
			host:  fakeHost{kvm: "device", cpuinfo: noVirt, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048"},
			lines: []string{verdictTCG("the CPU has no vmx or svm flag"), capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "the pod's CPU limit",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib, cpuMax: "950000 100000", memMax: "max"},
			env:   []string{"LEGATO_NPROC=64", "LEGATO_DESKTOP_CPUS=4", "LEGATO_DESKTOP_MEM_MIB=4096"},
			lines: []string{kvmUsable, capLine(2, 9, 65536, 4, 4096)},
		},
		{
			name:  "the pod's memory limit",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib, cpuMax: "max 100000", memMax: strconv.Itoa(10 << 30)},
			env:   []string{"LEGATO_NPROC=64", "LEGATO_DESKTOP_CPUS=4", "LEGATO_DESKTOP_MEM_MIB=4096"},
			lines: []string{kvmUsable, capLine(2, 64, 10240, 4, 4096)},
		},
		{
			name:  "limits above the node's",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 8 * gib, cpuMax: "6400000 100000", memMax: strconv.Itoa(64 << 30)},
			env:   []string{"LEGATO_NPROC=16", "LEGATO_DESKTOP_CPUS=4", "LEGATO_DESKTOP_MEM_MIB=4096"},
			lines: []string{kvmUsable, capLine(2, 16, 8192, 4, 4096)},
		},
		{
			name: "not one desktop fits",
			host: fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:  []string{"LEGATO_NPROC=2", "LEGATO_DESKTOP_CPUS=4", "LEGATO_DESKTOP_MEM_MIB=4096"},
			lines: []string{kvmUsable, capLine(0, 2, 65536, 4, 4096),
				"warning: not one desktop fits; give the pod more CPUs or memory, or set LEGATO_DESKTOP_CPUS and LEGATO_DESKTOP_MEM_MIB to legato's --vcpus and --memory"},
		},
		{
			name: "a container's own /dev/shm: fork templates do not fit",
			host: fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:  []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048", "LEGATO_SHM_MIB=64"},
			lines: []string{kvmUsable, capLine(4, 8, 65536, 2, 2048),
				"warning: /dev/shm holds 64 MiB, less than one desktop's 2048 MiB: legato's --golden-fork templates do not fit there, and attempts load golden states in place; mount a memory-backed emptyDir at /dev/shm (daemonset.yaml's fork-shm)"},
		},
		{
			name:  "a memory-backed /dev/shm as large as a desktop",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=8", "LEGATO_DESKTOP_CPUS=2", "LEGATO_DESKTOP_MEM_MIB=2048", "LEGATO_SHM_MIB=2048"},
			lines: []string{kvmUsable, capLine(4, 8, 65536, 2, 2048)},
		},
		{
			name:  "a size with a leading zero is decimal",
			host:  fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 * gib},
			env:   []string{"LEGATO_NPROC=010", "LEGATO_DESKTOP_CPUS=02", "LEGATO_DESKTOP_MEM_MIB=08192"},
			lines: []string{kvmUsable, capLine(5, 10, 65536, 2, 8192)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, hostDir := tc.host.make(t), t.TempDir()
			env := append([]string{"LEGATO_HOST_ROOT=" + root, "LEGATO_HOST_DIR=" + hostDir}, tc.env...)
			stdout, stderr, code := runEntrypoint(t, env, "--check")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var want string
			for _, l := range tc.lines {
				want += "legato-host: " + l + "\n"
			}
			if diff := cmp.Diff(want, stdout); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			// --check writes nothing: no cap file, and no /dev/kvm made by
			// opening a missing one.
			if ents, err := os.ReadDir(hostDir); err != nil || len(ents) != 0 {
				t.Errorf("--check left %v in the host dir (%v)", ents, err)
			}
			if _, err := os.Lstat(filepath.Join(root, "dev", "kvm")); tc.host.kvm == "" && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("--check made a /dev/kvm: %v", err)
			}
		})
	}
}

// TestEntrypointRefuses checks that a value that cannot work exits 2 (1
// for a host it cannot read), naming the variable and what it takes.
func TestEntrypointRefuses(t *testing.T) {
	good := fakeHost{kvm: "device", cpuinfo: intelVMX, memKiB: 64 << 20}
	for _, tc := range []struct {
		name string
		host fakeHost
		env  []string
		args []string
		code int
		want string
	}{
		{"no vCPUs", good, []string{"LEGATO_DESKTOP_CPUS=0"}, nil, 2, "LEGATO_DESKTOP_CPUS=0: want a whole number from 1 to 256"},
		{"memory with a unit", good, []string{"LEGATO_DESKTOP_MEM_MIB=4GiB"}, nil, 2, "LEGATO_DESKTOP_MEM_MIB=4GiB: want a whole number from 256 to 1048576"},
		{"memory below legato's --memory", good, []string{"LEGATO_DESKTOP_MEM_MIB=255"}, nil, 2, "LEGATO_DESKTOP_MEM_MIB=255: want a whole number from 256 to 1048576"},
		{"a negative count", good, []string{"LEGATO_DESKTOP_CPUS=-4"}, nil, 2, "LEGATO_DESKTOP_CPUS=-4: want a whole number"},
		{"a /dev/shm size with a unit", good, []string{"LEGATO_SHM_MIB=64M"}, nil, 2, "LEGATO_SHM_MIB=64M: want a whole number"},
		{"a number too long for the shell", good, []string{"LEGATO_DESKTOP_CPUS=99999999999999999999"}, nil, 2, "LEGATO_DESKTOP_CPUS=99999999999999999999: want"},
		{"an unknown argument", good, nil, []string{"--bogus"}, 2, "usage: host-entrypoint.sh [--check]"},
		{"no MemAvailable", fakeHost{kvm: "device", cpuinfo: intelVMX}, nil, []string{"--check"}, 1, "no MemAvailable in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"LEGATO_HOST_ROOT=" + tc.host.make(t), "LEGATO_HOST_DIR=" + t.TempDir(), "LEGATO_NPROC=8"}, tc.env...)
			args := tc.args
			if args == nil {
				args = []string{"--check"}
			}
			_, stderr, code := runEntrypoint(t, env, args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// TestEntrypointParses checks the script's syntax with bash -n, and with
// shellcheck where it is installed.
func TestEntrypointParses(t *testing.T) {
	if out, err := exec.CommandContext(t.Context(), "bash", "-n", "host-entrypoint.sh").CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Log("no shellcheck; bash -n only")
		return
	}
	if out, err := exec.CommandContext(t.Context(), sc, "host-entrypoint.sh").CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}

// TestEntrypointPoolAutostarted runs the entrypoint's ensure_pool against
// a fake virsh whose pool is defined and not yet running when asked, and
// that libvirtd starts itself (autostart) before the entrypoint's
// pool-start: as when a container is started again, with its libvirt
// definitions kept. pool-start then fails with "already active", and the
// pool runs: the entrypoint goes on. A pool that does not start is an
// error naming it.
func TestEntrypointPoolAutostarted(t *testing.T) {
	for _, tc := range []struct {
		name, start string // the pool's state after the fake virsh's pool-start
		msg         string // pool-start's error
		code        int
		want        string
	}{
		{"autostarted meanwhile", "running", "error: Requested operation is not valid: storage pool 'legato' is already active", 0, "legato-host: storage pool legato at "},
		// libvirtd is still starting it: pool-info does not say running yet.
		{"autostarting", "inactive", "error: Requested operation is not valid: storage pool 'legato' is already active", 0, "legato-host: storage pool legato at "},
		{"does not start", "inactive", "error: no room", 1, "legato-host: start the storage pool legato: error: no room"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			// pool-info answers from the state file; pool-start sets it
			// and fails as libvirt does.
			virsh := `#!/bin/sh
for a; do cmd=$a; case $a in pool-*) break ;; esac; done
case $cmd in
  pool-info) echo "State:          $(cat ` + state + `)" ;;
  pool-start)
    echo ` + tc.start + ` >` + state + `
    echo "` + tc.msg + `" >&2
    exit 1 ;;
  *) echo "unexpected virsh $*" >&2; exit 3 ;;
esac
`
			if err := os.WriteFile(filepath.Join(dir, "virsh"), []byte(virsh), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(state, []byte("inactive\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(t.Context(), "bash", "-c", "source ./host-entrypoint.sh && ensure_pool")
			// LEGATO_FLEET_KEYS names no file: an entrypoint that starts
			// when sourced stops at once, changing nothing here.
			cmd.Env = childenv.Minimal("PATH="+dir+":"+os.Getenv("PATH"), "LEGATO_HOST_DIR="+t.TempDir(),
				"LEGATO_FLEET_KEYS="+filepath.Join(dir, "none"), "LEGATO_NPROC=8")
			out, err := cmd.CombinedOutput()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d, output %q; want exit %d and %q", code, out, tc.code, tc.want)
			}
		})
	}
}
