package hostagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// ErrGone means the agent's session ended (the agent exited, the SSH
// connection was lost, or Close ran): the agent ended every clone and
// template of it.
var ErrGone = errors.New("host agent gone")

// Client is the fleet's side of one agent session. Its methods may be
// called concurrently.
type Client struct {
	host string // names the host in errors
	w    io.WriteCloser
	log  *slog.Logger
	// close ends the session's transport (nil: closing w is all).
	close func() error

	wmu sync.Mutex
	enc *json.Encoder

	mu      sync.Mutex
	next    uint64
	pending map[uint64]func(Reply, error)
	err     error // why the session ended; nil while it runs
	done    chan struct{}
}

// NewClient starts a session over the agent's stdout r and stdin w; host
// names the agent's host in errors. closeFn, if not nil, ends the
// transport after Close closed w (an SSH channel). The client reads r
// until it ends.
func NewClient(host string, r io.Reader, w io.WriteCloser, closeFn func() error, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{host: host, w: w, close: closeFn, log: log, enc: json.NewEncoder(w), pending: map[uint64]func(Reply, error){}, done: make(chan struct{})}
	go c.read(r)
	return c
}

// read hands each reply to its caller until r ends, then fails the
// calls still waiting.
func (c *Client) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		var rep Reply
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			c.log.Warn("host agent sent a line that is not a reply; ignoring it", "host", c.host, "line", fmt.Sprintf("%.200q", sc.Bytes()))
			continue
		}
		c.mu.Lock()
		f := c.pending[rep.ID]
		delete(c.pending, rep.ID)
		c.mu.Unlock()
		switch {
		case f != nil:
			f(rep, nil)
		case rep.Error != "":
			c.log.Warn("host agent error", "host", c.host, "err", rep.Error)
		}
	}
	err := sc.Err()
	if err == nil {
		err = io.EOF
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: host %s: its session ended: %v", ErrGone, c.host, err)
	}
	gone, waiting := c.err, c.pending
	c.pending = map[uint64]func(Reply, error){}
	c.mu.Unlock()
	for _, f := range waiting {
		f(Reply{}, gone)
	}
	close(c.done)
}

// Done is closed when the session ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the session ended (wrapping ErrGone); nil while it runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the session: the agent sees EOF, ends every clone and
// template of this session, removes their files and exits. Close waits
// for that, at most timeout, then ends the transport.
func (c *Client) Close(timeout time.Duration) error {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: host %s: the session was closed", ErrGone, c.host)
	}
	c.mu.Unlock()
	c.wmu.Lock()
	werr := c.w.Close()
	c.wmu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-c.done:
	case <-t.C:
		err = fmt.Errorf("host %s: the host agent did not end within %v after its session closed", c.host, timeout)
	}
	if c.close != nil {
		err = errors.Join(err, c.close())
	}
	<-c.done
	if err == nil && werr != nil && !errors.Is(werr, net.ErrClosed) && !errors.Is(werr, io.ErrClosedPipe) {
		err = werr
	}
	return err
}

// call sends a request and waits for its reply. When ctx ends first, the
// agent is told to cancel it, and what its late reply made is ended.
func (c *Client) call(ctx context.Context, req Request) (Reply, error) {
	type answer struct {
		rep Reply
		err error
	}
	got := make(chan answer, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return Reply{}, err
	}
	c.next++
	req.ID = c.next
	c.pending[req.ID] = func(r Reply, err error) { got <- answer{r, err} }
	c.mu.Unlock()
	if err := c.send(req); err != nil {
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
		return Reply{}, err
	}
	select {
	case a := <-got:
		if a.err != nil {
			return Reply{}, a.err
		}
		if err := replyError(a.rep); err != nil {
			return a.rep, fmt.Errorf("host %s: %s: %w", c.host, req.Op, err)
		}
		return a.rep, nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	_, waiting := c.pending[req.ID]
	if waiting {
		c.pending[req.ID] = c.orphan
	}
	c.mu.Unlock()
	if !waiting {
		// The reply came meanwhile: it is ours to end.
		a := <-got
		c.orphan(a.rep, a.err)
	} else {
		c.send(Request{Op: OpCancel, Cancel: req.ID})
	}
	return Reply{}, context.Cause(ctx)
}

// orphan ends what the reply to a request nobody waits for made. It runs
// on the reader: the agent reads requests while it writes replies, so the
// send does not wait for this reader.
func (c *Client) orphan(r Reply, err error) {
	switch {
	case err != nil:
		// The session ended: the agent ended it all.
	case r.Clone != nil:
		c.send(Request{ID: c.id(), Op: OpEnd, Clone: r.Clone.Name})
	case r.Template != nil:
		c.send(Request{ID: c.id(), Op: OpDrop, Template: r.Template.Name})
	}
}

// id takes a request id whose reply nobody waits for.
func (c *Client) id() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return c.next
}

// send writes one request line.
func (c *Client) send(req Request) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.enc.Encode(req); err != nil {
		if gone := c.Err(); gone != nil {
			return gone
		}
		return fmt.Errorf("host %s: send %s to the host agent: %w", c.host, req.Op, err)
	}
	return nil
}

// Hello asks the agent what it is; an agent of another protocol version
// is an error.
func (c *Client) Hello(ctx context.Context) (Hello, error) {
	rep, err := c.call(ctx, Request{Op: OpHello})
	if err != nil {
		return Hello{}, err
	}
	if rep.Hello == nil {
		return Hello{}, fmt.Errorf("host %s: the host agent answered hello without itself", c.host)
	}
	if rep.Hello.Version != Version {
		return *rep.Hello, fmt.Errorf("host %s: the host agent speaks protocol %d, this legato %d: install the same legato on the host", c.host, rep.Hello.Version, Version)
	}
	return *rep.Hello, nil
}

// Sweep has the agent remove the templates and clones a killed agent
// left on its host, and names what it removed.
func (c *Client) Sweep(ctx context.Context) ([]string, error) {
	rep, err := c.call(ctx, Request{Op: OpSweep})
	return rep.Swept, err
}

// Reserve keeps (on) or releases a parked VM's ports on the agent's host:
// no clone started meanwhile takes them.
func (c *Client) Reserve(ctx context.Context, p vm.Ports, on bool) error {
	_, err := c.call(ctx, Request{Op: OpReserve, Ports: wirePorts(p), On: on})
	return err
}

// Template has the agent take a template of the domain d on its host.
func (c *Client) Template(ctx context.Context, d vm.DomainRef) (*RemoteTemplate, error) {
	rep, err := c.call(ctx, Request{Op: OpTemplate, Domain: &d})
	if err != nil {
		return nil, err
	}
	if rep.Template == nil {
		return nil, fmt.Errorf("host %s: the host agent answered template without one", c.host)
	}
	return &RemoteTemplate{c: c, info: *rep.Template}, nil
}

// RemoteTemplate is a template the agent took on its host.
type RemoteTemplate struct {
	c    *Client
	info TemplateInfo

	closeOnce sync.Once
	closeErr  error
}

// Name names the template (its directory on the host).
func (t *RemoteTemplate) Name() string { return t.info.Name }

// Timings say what taking it took on the host.
func (t *RemoteTemplate) Timings() vm.TemplateTimings { return t.info.Timings }

// Fork has the agent start a clone of the template.
func (t *RemoteTemplate) Fork(ctx context.Context) (*RemoteClone, error) {
	rep, err := t.c.call(ctx, Request{Op: OpFork, Template: t.info.Name})
	if err != nil {
		return nil, err
	}
	if rep.Clone == nil {
		return nil, fmt.Errorf("host %s: the host agent answered fork without a clone", t.c.host)
	}
	return &RemoteClone{c: t.c, info: *rep.Clone}, nil
}

// Prestart has the agent start up to n clones ahead (vm.Template.Prestart).
func (t *RemoteTemplate) Prestart(ctx context.Context, n int) error {
	_, err := t.c.call(ctx, Request{Op: OpPrestart, Template: t.info.Name, N: n})
	return err
}

// CheckRAM has the agent check the template's RAM file's content
// (vm.Template.CheckRAM).
func (t *RemoteTemplate) CheckRAM(ctx context.Context) error {
	_, err := t.c.call(ctx, Request{Op: OpCheck, Template: t.info.Name})
	return err
}

// Close has the agent end the template's clones and remove its files. A
// session that ended did that already.
func (t *RemoteTemplate) Close() error {
	t.closeOnce.Do(func() { t.closeErr = t.c.end(Request{Op: OpDrop, Template: t.info.Name}) })
	return t.closeErr
}

// RemoteClone is a clone the agent started on its host.
type RemoteClone struct {
	c    *Client
	info CloneInfo

	closeOnce sync.Once
	closeErr  error
}

// Name is the clone's QEMU -name.
func (c *RemoteClone) Name() string { return c.info.Name }

// Ports are the clone's own ports on the host's 127.0.0.1.
func (c *RemoteClone) Ports() vm.Ports { return c.info.Ports.vm() }

// PID is the clone's QEMU process on the host.
func (c *RemoteClone) PID() int { return c.info.PID }

// Restore is how long the fork took on the host from a started QEMU to a
// running guest.
func (c *RemoteClone) Restore() time.Duration { return c.info.Restore }

// Started is how long starting the clone's QEMU took, and whether it
// happened ahead of the fork.
func (c *RemoteClone) Started() (time.Duration, bool) { return c.info.Started, c.info.Spare }

// Forward has the agent forward the ports p (a parked VM's, on the host's
// 127.0.0.1) to the clone (vm.Clone.Forward).
func (c *RemoteClone) Forward(ctx context.Context, p vm.Ports) error {
	_, err := c.c.call(ctx, Request{Op: OpForward, Clone: c.info.Name, Ports: wirePorts(p)})
	return err
}

// Close has the agent kill the clone and remove its files. A session
// that ended did that already.
func (c *RemoteClone) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.c.end(Request{Op: OpEnd, Clone: c.info.Name}) })
	return c.closeErr
}

// endTimeout bounds ending a clone or a template: the agent kills a QEMU
// and removes a directory.
const endTimeout = time.Minute

// end sends an end or a drop and waits for it; one whose thing the agent
// no longer has, or whose session ended (the agent ended it all), is
// done.
func (c *Client) end(req Request) error {
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	_, err := c.call(ctx, req)
	if errors.Is(err, ErrGone) || errors.Is(err, ErrUnknown) {
		return nil
	}
	return err
}
