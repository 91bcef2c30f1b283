package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// conn is one libvirt connection whose every call is bounded (see the
// package documentation). It redials after a call had to be cut off. Safe
// for concurrent use.
type conn struct {
	host    *Host
	timeout time.Duration

	mu sync.Mutex
	lv *libvirt.Libvirt // nil until dialed, and after a call was cut off
	nc net.Conn         // lv's socket, closed to cut a stuck call off
}

func newConn(h *Host, timeout time.Duration) *conn {
	return &conn{host: h, timeout: timeout}
}

// capturingDialer hands go-libvirt the connection it dials and keeps it,
// so that a stuck call can be cut off by closing it.
type capturingDialer struct {
	dial func() (net.Conn, error)

	mu   sync.Mutex
	conn net.Conn
	cut  bool
}

func (d *capturingDialer) Dial() (net.Conn, error) {
	c, err := d.dial()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		// The connect was given up while dialing: nobody will close this
		// connection later.
		c.Close()
		return nil, net.ErrClosed
	}
	d.conn = c
	return c, nil
}

// cutOff closes the dialed connection, or any that is dialed later.
func (d *capturingDialer) cutOff() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	if d.conn != nil {
		d.conn.Close()
	}
}

// client returns the live libvirt client, dialing one if needed.
func (c *conn) client(ctx context.Context) (*libvirt.Libvirt, net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lv != nil && c.lv.IsConnected() {
		return c.lv, c.nc, nil
	}
	c.dropLocked()
	// The dial may outlive ctx's call (the connection is kept), but not
	// ctx itself while it dials.
	d := &capturingDialer{dial: func() (net.Conn, error) { return c.host.dialLibvirt(ctx) }}
	lv := libvirt.NewWithDialer(d)
	err := bounded(ctx, c.timeout, func() error { return lv.ConnectToURI(c.host.ep.name) }, d.cutOff)
	if err != nil {
		return nil, nil, &Error{Op: "connect to libvirt", Err: fmt.Errorf("%w: host %s (%s): %w", ErrLibvirtUnavailable, c.host.ep.label, c.host.where(), err)}
	}
	c.lv, c.nc = lv, d.conn
	return lv, d.conn, nil
}

// do runs one libvirt call, bounded by ctx and the call timeout.
func (c *conn) do(ctx context.Context, op string, fn func(lv *libvirt.Libvirt) error) error {
	return c.run(ctx, op, c.timeout, fn)
}

// resume lets a paused domain's guest run again (after a loadvm, which
// leaves it paused when it fails, or a suspend).
func (c *conn) resume(ctx context.Context, dom libvirt.Domain) error {
	return c.do(ctx, "resume", func(lv *libvirt.Libvirt) error { return lv.DomainResume(dom) })
}

// doLong runs one libvirt call that takes as long as it takes (a volume
// upload), bounded by ctx only.
func (c *conn) doLong(ctx context.Context, op string, fn func(lv *libvirt.Libvirt) error) error {
	return c.run(ctx, op, 0, fn)
}

func (c *conn) run(ctx context.Context, op string, timeout time.Duration, fn func(lv *libvirt.Libvirt) error) error {
	lv, nc, err := c.client(ctx)
	if err != nil {
		return err
	}
	cut := false
	err = bounded(ctx, timeout, func() error { return fn(lv) }, func() {
		// Closing the socket fails the pending call (go-libvirt's
		// ErrInterrupted), so the goroutine returns.
		cut = true
		nc.Close()
	})
	if cut || errors.Is(err, libvirt.ErrInterrupted) {
		// go-libvirt fails the pending call before lv.IsConnected turns
		// false, so the next call could still pick this client and fail
		// at once ("invalid argument"); drop it here so that one dials.
		c.forget(lv)
	}
	if err != nil {
		return classify(op, err)
	}
	return nil
}

// forget drops lv, whose socket is closed or lost, unless another call has
// already replaced it.
func (c *conn) forget(lv *libvirt.Libvirt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lv == lv {
		c.dropLocked()
	}
}

// bounded runs fn and waits for it; if ctx is done or timeout (0: none)
// passes first, it calls cut, which must make fn return soon, and waits for
// that. The error then wraps ctx's error or ErrTimeout.
func bounded(ctx context.Context, timeout time.Duration, fn func() error, cut func()) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	var expired <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}
	var why error
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		why = context.Cause(ctx)
	case <-expired:
		why = fmt.Errorf("%w after %v", ErrTimeout, timeout)
	}
	cut()
	<-done
	return why
}

// close disconnects; later calls dial again.
func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lv != nil && c.lv.IsConnected() {
		// Disconnect sends a close RPC first; bound it like any call.
		lv, nc := c.lv, c.nc
		_ = bounded(context.Background(), c.timeout, lv.Disconnect, func() { nc.Close() })
	}
	c.dropLocked()
}

func (c *conn) dropLocked() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.lv != nil {
		// Waits (briefly) for go-libvirt's reader goroutines to see the
		// closed socket, so none outlives the connection.
		<-c.lv.Disconnected()
	}
	c.lv, c.nc = nil, nil
}

// classify wraps a libvirt failure as an *Error, keeping the cause for
// errors.Is/As (libvirt.Error, ErrTimeout, context errors).
func classify(op string, err error) error {
	if errors.Is(err, libvirt.ErrInterrupted) {
		err = fmt.Errorf("%w: connection to libvirtd lost: %w", ErrLibvirtUnavailable, err)
	}
	return &Error{Op: op, Err: err}
}

// libvirtCode returns the libvirt error number inside err, if any.
func libvirtCode(err error) (libvirt.ErrorNumber, bool) {
	var le libvirt.Error
	if errors.As(err, &le) {
		return libvirt.ErrorNumber(le.Code), true
	}
	return 0, false
}

// isNoDomain reports whether err says the domain does not exist (any more).
func isNoDomain(err error) bool {
	code, ok := libvirtCode(err)
	return ok && code == libvirt.ErrNoDomain
}

// isNotRunning reports whether err says the domain is not running, as
// destroying a stopped domain does.
func isNotRunning(err error) bool {
	code, ok := libvirtCode(err)
	return ok && code == libvirt.ErrOperationInvalid
}
