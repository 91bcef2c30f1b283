package vm

import (
	"strings"
	"testing"
)

func TestCheckSnapshotName(t *testing.T) {
	for _, ok := range []string{"legato-golden-0123456789abcdef", "a", "A.b_c-1", strings.Repeat("x", 64)} {
		if err := checkSnapshotName(ok); err != nil {
			t.Errorf("checkSnapshotName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a b", "a;info", "a\nb", "<x>", strings.Repeat("x", 65), SnapshotName} {
		if err := checkSnapshotName(bad); err == nil {
			t.Errorf("checkSnapshotName(%q): no error", bad)
		}
	}
}

func TestSnapshotXMLKeepsTheDescription(t *testing.T) {
	desc := `legato golden state of task <a & "b">; key 00ff; qemu="7.2"`
	x, err := snapshotXML("legato-golden-1", desc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(x, "<name>legato-golden-1</name>") {
		t.Errorf("snapshot xml %s: no name", x)
	}
	got, err := snapshotDescription(x)
	if err != nil {
		t.Fatal(err)
	}
	if got != desc {
		t.Errorf("description back %q, want %q", got, desc)
	}
	if _, err := snapshotDescription("<domainsnapshot"); err == nil {
		t.Error("broken xml read without error")
	}
}

func TestMachineHash(t *testing.T) {
	spec := func() domainSpec {
		return domainSpec{Name: "legato-a-0", Accel: AccelTCG, VCPUs: 2, MemoryMiB: 1536, Overlay: "/pool/legato-a-0.qcow2",
			Kernel: "/pool/legato-kernel-0123456789abcdef", Cmdline: "console=ttyS0", Forwards: []forward{{Host: 40001, Guest: 5000}, {Host: 40002, Guest: 9222}}}
	}
	hash := func(s domainSpec) string {
		t.Helper()
		h, err := machineHash(s)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	base := hash(spec())
	// Another VM of the same configuration: same machine.
	other := spec()
	other.Name, other.Overlay = "legato-a-1", "/pool/legato-a-1.qcow2"
	other.Forwards = []forward{{Host: 41001, Guest: 5000}, {Host: 41002, Guest: 9222}}
	if h := hash(other); h != base {
		t.Errorf("another VM of the configuration: machine %s, want %s", h, base)
	}
	for name, change := range map[string]func(*domainSpec){
		"memory":       func(s *domainSpec) { s.MemoryMiB = 2048 },
		"vcpus":        func(s *domainSpec) { s.VCPUs = 1 },
		"accel":        func(s *domainSpec) { s.Accel = AccelKVM },
		"cmdline":      func(s *domainSpec) { s.Cmdline = "console=ttyS0 quiet" },
		"a guest port": func(s *domainSpec) { s.Forwards = append(s.Forwards, forward{Host: 40003, Guest: 8080}) },
		// The kernel's volume is named after its content.
		"kernel": func(s *domainSpec) { s.Kernel = "/pool/legato-kernel-fedcba9876543210" },
		"initrd": func(s *domainSpec) { s.Initrd = "/pool/legato-initrd-0123456789abcdef" },
	} {
		s := spec()
		change(&s)
		if h := hash(s); h == base {
			t.Errorf("%s changed: same machine %s", name, h)
		}
	}
}
