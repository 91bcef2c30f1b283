package osworld

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/vm"
)

// TestBootTimeoutBoundsAttach: a guest given by URL that never answers
// fails its desktop after BootTimeout, the bound that applies to VMs too,
// instead of a separate, longer attach bound.
func TestBootTimeoutBoundsAttach(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there any more: every probe is refused

	p, err := NewPool(t.Context(), Config{
		Guests:      []GuestAddr{{URL: dead}},
		BootTimeout: 700 * time.Millisecond,
		CacheDir:    t.TempDir(),
		Grade:       GradeConfig{Mode: grade.NativeOnly},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := p.New(t.Context(), 0)
	if err == nil {
		d.Close()
		t.Fatal("a desktop attached to a dead guest")
	}
	if !errors.Is(err, guest.ErrTimeout) || !strings.Contains(err.Error(), "not ready after 700ms") {
		t.Errorf("New = %v, want a timeout after the boot timeout (700ms)", err)
	}
}

func TestVMBootTimeoutRefused(t *testing.T) {
	err := Config{VM: vm.Config{BaseImage: "/x.qcow2", BootTimeout: time.Minute}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "VM.BootTimeout 1m0s: leave it zero and set BootTimeout") {
		t.Errorf("Validate = %v, want it to point VM.BootTimeout to BootTimeout", err)
	}
}
