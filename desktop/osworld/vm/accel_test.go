package vm

import (
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

func TestDetectAccel(t *testing.T) {
	const (
		intel = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr vmx ept\n\nprocessor\t: 1\nflags\t\t: fpu vme vmx\n"
		amd   = "processor\t: 0\nflags\t\t: fpu svm npt\n"
		plain = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr hypervisor\nvmx flags\t: ept\n"
	)
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	dir := &fstest.MapFile{Mode: 0o755 | 1<<31}
	tests := []struct {
		name string
		fs   fstest.MapFS
		want Accel
	}{
		{"intel with vmx", fstest.MapFS{"dev/kvm": file(""), "proc/cpuinfo": file(intel)}, AccelKVM},
		{"amd with svm", fstest.MapFS{"dev/kvm": file(""), "proc/cpuinfo": file(amd)}, AccelKVM},
		{"no /dev/kvm", fstest.MapFS{"proc/cpuinfo": file(intel)}, AccelTCG},
		{"pvm host", fstest.MapFS{"dev/kvm": file(""), "sys/module/kvm_pvm": dir, "proc/cpuinfo": file(intel)}, AccelTCG},
		// "vmx flags" is another line; only the flags line counts.
		{"no vmx or svm flag", fstest.MapFS{"dev/kvm": file(""), "proc/cpuinfo": file(plain)}, AccelTCG},
		{"no cpuinfo", fstest.MapFS{"dev/kvm": file("")}, AccelTCG},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := detectAccel(tt.fs)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("detectAccel (-want +got):\n%s", diff)
			}
			if why == "" {
				t.Error("detectAccel gave no reason")
			}
		})
	}
}

func TestResolveAccel(t *testing.T) {
	detect := func() (Accel, string) { return AccelTCG, "detected" }
	for _, tt := range []struct {
		in, want Accel
	}{{AccelAuto, AccelTCG}, {AccelKVM, AccelKVM}, {AccelTCG, AccelTCG}} {
		if got, _ := resolveAccel(tt.in, detect); got != tt.want {
			t.Errorf("resolveAccel(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
