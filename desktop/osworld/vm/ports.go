package vm

import (
	"fmt"
	"net"
	"strconv"
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
	for range n {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port on 127.0.0.1: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
