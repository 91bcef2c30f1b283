package osworld

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// dialFunc connects to an address as a desktop's host sees it: a remote
// host's guest ports are on its own 127.0.0.1, reached through its SSH
// connection (vm.Host.DialContext).
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// guestDialTimeout bounds connecting to a guest port: a forward accepts
// before the guest listens, so a dead one must not eat a whole call.
const guestDialTimeout = 10 * time.Second

// hostHTTP returns an HTTP client whose connections go through dial, with
// no proxy, as the guest package's own client would be.
func hostHTTP(dial dialFunc, keepAlive bool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DisableKeepAlives = !keepAlive
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, guestDialTimeout)
		defer cancel()
		return dial(ctx, network, addr)
	}
	return &http.Client{Transport: tr}
}

// forward listens on this machine's 127.0.0.1 and passes each connection
// on to an address as a desktop's host sees it. OSWorld's Python getters
// (the grader's bridge) open their own connections to the guest's ports:
// for a remote host they get a forward per port, never a port opened on
// the host.
type forward struct {
	ln     net.Listener
	dial   dialFunc
	target string

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

func newForward(dial dialFunc, target string) (*forward, error) {
	// Never a parked VM's port, which its clone takes next.
	ln, err := vm.ListenLoopback()
	if err != nil {
		return nil, err
	}
	f := &forward{ln: ln, dial: dial, target: target, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

func (f *forward) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *forward) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go f.serve(c)
	}
}

// track adds c to the open connections, unless the forward is closed.
func (f *forward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = true
	return true
}

func (f *forward) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

func (f *forward) serve(c net.Conn) {
	defer f.wg.Done()
	defer f.untrack(c)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), guestDialTimeout)
	out, err := f.dial(ctx, "tcp", f.target)
	cancel()
	if err != nil {
		return
	}
	if !f.track(out) {
		out.Close()
		return
	}
	defer f.untrack(out)
	defer out.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(out, c)
		closeWrite(out)
		close(done)
	}()
	io.Copy(c, out)
	closeWrite(c)
	<-done
}

// closeWrite half-closes a connection that can, and closes one that
// cannot, so the copy the other way ends too.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	c.Close()
}

// close stops listening, closes every connection and waits for them.
func (f *forward) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}

// forwards are a desktop's forwards, closed together.
type forwards []*forward

// add opens a forward to target, or returns 0 when target is empty.
func (fs *forwards) add(dial dialFunc, host string, port int) (int, error) {
	if port == 0 {
		return 0, nil
	}
	f, err := newForward(dial, net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	*fs = append(*fs, f)
	return f.port(), nil
}

func (fs forwards) close() {
	for _, f := range fs {
		f.close()
	}
}
