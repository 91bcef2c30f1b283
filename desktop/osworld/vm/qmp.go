package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a connection to the QMP monitor of a QEMU this process started
// (a fork clone); a libvirt domain's monitor is reached through libvirt.
//
// It is written here rather than taken from go-qemu's qmp package because
// that package's Run takes no context: a QEMU that stops answering would
// hold the caller forever. Here every command is bounded by its ctx (the
// connection's deadline follows it) and a command that timed out closes
// the connection, so nothing waits on a half-read reply.
type qmp struct {
	mu   sync.Mutex // one command at a time
	conn net.Conn
	r    *bufio.Reader
}

// qmpError is QEMU's answer to a command that failed.
type qmpError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *qmpError) Error() string {
	return fmt.Sprintf("qemu %s: %s (%s)", e.Command, e.Desc, e.Class)
}

// dialQMP connects to the monitor socket at path, reads QEMU's greeting and
// leaves capabilities negotiation, so commands can run.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qemu monitor %s: %w", path, err)
	}
	q := &qmp{conn: c, r: bufio.NewReaderSize(c, 64<<10)}
	err = q.bounded(ctx, func() error {
		var greeting struct {
			QMP json.RawMessage `json:"QMP"`
		}
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return err
		}
		if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
			return fmt.Errorf("not a QMP greeting: %q", line)
		}
		return q.roundTrip("qmp_capabilities", nil, nil)
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("qemu monitor %s: %w", path, err)
	}
	return q, nil
}

// run executes command with args (nil for none) and decodes its return
// value into out (nil to ignore it).
func (q *qmp) run(ctx context.Context, command string, args, out any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bounded(ctx, func() error { return q.roundTrip(command, args, out) })
}

// bounded runs f with the connection's deadline at ctx's; when ctx ends
// first the connection is closed, which makes f return.
func (q *qmp) bounded(ctx context.Context, f func() error) error {
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(dl)
	} else {
		q.conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { q.conn.Close() })
	err := f()
	if !stop() || ctx.Err() != nil {
		// ctx ended: the AfterFunc closes the connection, maybe not yet;
		// close it here too, so no later command writes to it.
		q.conn.Close()
		return errors.Join(context.Cause(ctx), err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// The connection's deadline is ctx's, which the read can reach
		// a moment before ctx says so.
		q.conn.Close()
		return errors.Join(context.DeadlineExceeded, err)
	}
	return err
}

// qmpRequest encodes a QMP command, for this connection or libvirt's
// monitor passthrough.
func qmpRequest(command string, args any) ([]byte, error) {
	return json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, args})
}

// qmpReply decodes one line QEMU sent after command: an event (event is
// true: the reply is still to come), an error, or the return value, into
// out (nil to ignore it).
func qmpReply(command string, line []byte, out any) (event bool, err error) {
	var reply struct {
		Event  string          `json:"event"`
		Return json.RawMessage `json:"return"`
		Error  *qmpError       `json:"error"`
	}
	if err := json.Unmarshal(line, &reply); err != nil {
		return false, fmt.Errorf("qemu %s: unreadable reply %q: %w", command, line, err)
	}
	switch {
	case reply.Event != "":
		return true, nil
	case reply.Error != nil:
		reply.Error.Command = command
		return false, reply.Error
	case out != nil:
		return false, json.Unmarshal(reply.Return, out)
	}
	return false, nil
}

func (q *qmp) roundTrip(command string, args, out any) error {
	b, err := qmpRequest(command, args)
	if err != nil {
		return err
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return err
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return err
		}
		// Events come between commands; nothing here waits for one.
		if event, err := qmpReply(command, line, out); !event {
			return err
		}
	}
}

func (q *qmp) close() error { return q.conn.Close() }
