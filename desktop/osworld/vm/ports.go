package vm

import (
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Ports are the host ports, all on 127.0.0.1, forwarded to a VM's guest.
type Ports struct {
	// Guest reaches the OSWorld guest server.
	Guest int
	// DevTools reaches Chrome's DevTools protocol.
	DevTools int
	// VLC reaches VLC's HTTP interface.
	VLC int
}

// GuestURL is the base URL of the guest server.
func (p Ports) GuestURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Guest))
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago. It holds all n listeners at once so the kernel cannot hand out
// one port twice, then releases them for QEMU to bind. Another process may
// take one in between; QEMU then fails to start and Start retries with new
// ports.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port on 127.0.0.1: %w", err)
		}
		// Held until the end either way, so the kernel moves on.
		ls = append(ls, l)
		if p := l.Addr().(*net.TCPAddr).Port; !reserved(p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// reservedPorts are the ports of parked VMs (VM.Park): unbound while a
// clone takes them over, and not to be handed to anything else.
var reservedPorts struct {
	sync.Mutex
	set map[int]bool
}

// reservePorts reserves (on) or releases p's ports.
func reservePorts(p Ports, on bool) {
	reservedPorts.Lock()
	defer reservedPorts.Unlock()
	if reservedPorts.set == nil {
		reservedPorts.set = map[int]bool{}
	}
	for _, port := range []int{p.Guest, p.DevTools, p.VLC} {
		if on {
			reservedPorts.set[port] = true
		} else {
			delete(reservedPorts.set, port)
		}
	}
}

func reserved(port int) bool {
	reservedPorts.Lock()
	defer reservedPorts.Unlock()
	return reservedPorts.set[port]
}

// ListenLoopback listens on a free TCP port of 127.0.0.1 that is not a
// parked VM's (see VM.Park): a port picked by the kernel could be one.
func ListenLoopback() (net.Listener, error) {
	var skipped []net.Listener
	defer func() {
		for _, l := range skipped {
			l.Close()
		}
	}()
	for {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		if !reserved(l.Addr().(*net.TCPAddr).Port) {
			return l, nil
		}
		skipped = append(skipped, l) // held until a free one is found
	}
}

// ReservePorts keeps (on) or releases the ports of a VM parked on this
// machine by another process: a host agent's fleet parks its VMs through
// libvirt and says so, and no clone the agent starts meanwhile takes
// their ports.
func ReservePorts(p Ports, on bool) { reservePorts(p, on) }
