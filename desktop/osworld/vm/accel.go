package vm

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"strings"
)

// DetectAccel reports whether KVM really works on this host, and why: it
// returns AccelKVM or AccelTCG, never AccelAuto.
//
// libvirt's own capabilities cannot be trusted for this: on hosts that are
// themselves VMs, /dev/kvm may be "PVM" (kernel module kvm_pvm), which only
// runs specially patched guest kernels, while libvirt still offers
// type='kvm'. So KVM is used only when /dev/kvm exists, kvm_pvm is not
// loaded, and the CPU has hardware virtualisation (vmx or svm).
func DetectAccel() (Accel, string) {
	return detectAccel(os.DirFS("/"))
}

// detectAccel is DetectAccel on a file system rooted at "/", so tests can
// give it any /dev, /sys and /proc.
func detectAccel(root fs.FS) (Accel, string) {
	if _, err := fs.Stat(root, "dev/kvm"); err != nil {
		return AccelTCG, "no /dev/kvm"
	}
	if _, err := fs.Stat(root, "sys/module/kvm_pvm"); err == nil {
		return AccelTCG, "/dev/kvm is PVM (kvm_pvm loaded), which cannot boot ordinary guest kernels"
	}
	cpuinfo, err := fs.ReadFile(root, "proc/cpuinfo")
	if err != nil {
		return AccelTCG, "cannot read /proc/cpuinfo: " + err.Error()
	}
	if !hasVirtFlag(cpuinfo) {
		return AccelTCG, "the CPU has no vmx or svm flag"
	}
	return AccelKVM, "/dev/kvm and the CPU's vmx/svm flag are present"
}

// hasVirtFlag reports whether a /proc/cpuinfo lists vmx (Intel) or svm
// (AMD) among a CPU's flags.
func hasVirtFlag(cpuinfo []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		for _, f := range strings.Fields(val) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
	}
	return false
}

// resolveAccel turns AccelAuto into what the host supports.
func resolveAccel(a Accel, detect func() (Accel, string)) (Accel, string) {
	if a == AccelKVM || a == AccelTCG {
		return a, "set in the configuration"
	}
	return detect()
}
