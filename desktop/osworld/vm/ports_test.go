package vm

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortsAreDistinctAndBindable(t *testing.T) {
	for range 20 {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 {
			t.Fatalf("freePorts(3) gave %d ports", len(ports))
		}
		seen := map[int]bool{}
		var ls []net.Listener
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d given twice in %v", p, ports)
			}
			seen[p] = true
			// Released: QEMU (here: we) can bind each one on 127.0.0.1.
			l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("port %d from freePorts is not free: %v", p, err)
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
	}
}

func TestGuestURL(t *testing.T) {
	if got, want := (Ports{Guest: 41234}).GuestURL(), "http://127.0.0.1:41234"; got != want {
		t.Errorf("GuestURL = %q, want %q", got, want)
	}
}

func TestIsPortTaken(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{"internal error: qemu unexpectedly closed the monitor: qemu-system-x86_64: -netdev user,id=legatonet,restrict=on,hostfwd=tcp:127.0.0.1:40000-:5000: Could not set up host forwarding rule 'tcp:127.0.0.1:40000-:5000'", true},
		{"Cannot access storage file '/root/base.qcow2': Permission denied", false},
		// A malformed rule also names hostfwd, but new ports would not help.
		{"qemu-system-x86_64: -netdev user,id=legatonet,hostfwd=tcp:127.0.0.1:x-:5000: Invalid host forwarding rule 'tcp:127.0.0.1:x-:5000' (Bad host port)", false},
	} {
		if got := isPortTaken(errString(tt.msg)); got != tt.want {
			t.Errorf("isPortTaken(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
