package hostagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/vm"
)

// session is an agent serving a client over two pipes, as over an SSH
// channel.
type session struct {
	f      *fakeForker
	c      *Client
	served chan error // Serve's return
	out    *io.PipeWriter
}

func startSession(t *testing.T, f *fakeForker) *session {
	t.Helper()
	inR, inW := io.Pipe()   // fleet → agent
	outR, outW := io.Pipe() // agent → fleet
	s := &session{f: f, served: make(chan error, 1), out: outW}
	go func() {
		err := NewServer(f, nil).Serve(context.Background(), inR, outW)
		// The agent exits: its stdout closes.
		outW.Close()
		s.served <- err
	}()
	s.c = NewClient("h1", outR, inW, nil, nil)
	t.Cleanup(func() {
		s.c.Close(time.Minute)
		select {
		case <-s.served:
		default:
		}
	})
	return s
}

var dom = vm.DomainRef{Name: "legato-0-0a0b0c0d", Overlay: "/var/lib/libvirt/images/legato-0-0a0b0c0d.qcow2", Base: "/var/lib/libvirt/images/base.qcow2", MemoryMiB: 1536}

// The fleet takes a template, forks two clones, forwards a parked VM's
// ports to one, ends it, drops the template: the agent does each on its
// Forker and answers with what the fleet needs.
func TestAgentForksForTheFleet(t *testing.T) {
	s := startSession(t, newFakeForker())
	ctx := t.Context()
	h, err := s.c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != Version || h.ForkDir != "/dev/shm/fake" || h.PID == 0 {
		t.Errorf("hello: %+v", h)
	}
	tmpl, err := s.c.Template(ctx, dom)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Name() != "legato-fork-1" || tmpl.Timings().RAMBytes != 42<<20 {
		t.Errorf("template %q, timings %+v", tmpl.Name(), tmpl.Timings())
	}
	if err := tmpl.Prestart(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := tmpl.CheckRAM(ctx); err != nil {
		t.Fatal(err)
	}
	c1, err := tmpl.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := tmpl.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Name() == c2.Name() || c2.Ports() != (vm.Ports{Guest: 40002, DevTools: 41002, VLC: 42002}) || c2.PID() != 4242 {
		t.Errorf("clones %q %q, second's ports %+v pid %d", c1.Name(), c2.Name(), c2.Ports(), c2.PID())
	}
	if started, spare := c1.Started(); started != time.Second || !spare || c1.Restore() != 300*time.Millisecond {
		t.Errorf("clone timings: started %v spare %v restore %v", started, spare, c1.Restore())
	}
	parked := vm.Ports{Guest: 5000, DevTools: 5001, VLC: 5002}
	if err := s.c.Reserve(ctx, parked, true); err != nil {
		t.Fatal(err)
	}
	if err := c1.Forward(ctx, parked); err != nil {
		t.Fatal(err)
	}
	fc := s.f.clone(t, c1.Name())
	fc.mu.Lock()
	forwarded := fc.forwarded
	fc.mu.Unlock()
	if diff := cmp.Diff([]vm.Ports{parked}, forwarded); diff != "" {
		t.Errorf("forwards (-want +got):\n%s", diff)
	}
	if !s.f.isReserved(5001) {
		t.Error("the parked VM's ports were not reserved")
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := s.f.nextClosed(t); got != c1.Name() {
		t.Errorf("closed %q, want %q", got, c1.Name())
	}
	// A clone ended is unknown to the agent: forwarding to it says so.
	if err := c1.Forward(ctx, parked); !errors.Is(err, ErrUnknown) {
		t.Errorf("forward to an ended clone: %v, want ErrUnknown", err)
	}
	if err := tmpl.Close(); err != nil {
		t.Fatal(err)
	}
	if got := s.f.liveNames(); len(got) != 0 {
		t.Errorf("after the template was dropped, still live: %v", got)
	}
	swept, err := s.c.Sweep(ctx)
	if err != nil || len(swept) != 1 {
		t.Errorf("sweep: %v %v", swept, err)
	}
}

// The fleet's session ends (its stdin closes: the fleet closed it, was
// killed, or lost the connection): the agent ends every clone and
// template it made, and Serve returns.
func TestAgentEndsEverythingAtEOF(t *testing.T) {
	s := startSession(t, newFakeForker())
	ctx := t.Context()
	var made []string
	for range 2 {
		tmpl, err := s.c.Template(ctx, dom)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, tmpl.Name())
		for range 2 {
			c, err := tmpl.Fork(ctx)
			if err != nil {
				t.Fatal(err)
			}
			made = append(made, c.Name())
		}
	}
	if err := s.c.Close(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, s.served); err != nil {
		t.Errorf("Serve at EOF: %v", err)
	}
	if got := s.f.liveNames(); len(got) != 0 {
		t.Errorf("after EOF, still live: %v", got)
	}
	var closed []string
	for range made {
		closed = append(closed, s.f.nextClosed(t))
	}
	slices.Sort(made)
	slices.Sort(closed)
	if diff := cmp.Diff(made, closed); diff != "" {
		t.Errorf("ended (-made +ended):\n%s", diff)
	}
	// After the session, every call says it is gone.
	if _, err := s.c.Hello(ctx); !errors.Is(err, ErrGone) {
		t.Errorf("hello after Close: %v, want ErrGone", err)
	}
}

// The agent exits under a fleet that waits for a fork (it was killed, or
// the SSH connection went): the call fails at once with ErrGone, and
// ending the clones and templates it had is no error (the agent ended
// them).
func TestAgentGoneFailsWaitingCalls(t *testing.T) {
	f := newFakeForker()
	f.forkGate = make(chan struct{})
	s := startSession(t, f)
	ctx := t.Context()
	tmpl, err := s.c.Template(ctx, dom)
	if err != nil {
		t.Fatal(err)
	}
	forked := make(chan error, 1)
	go func() {
		_, err := tmpl.Fork(ctx)
		forked <- err
	}()
	recv(t, f.forking)
	// The agent's stdout closes: the fleet sees the agent gone.
	s.out.CloseWithError(errors.New("connection lost"))
	if err := recv(t, forked); !errors.Is(err, ErrGone) {
		t.Errorf("fork when the agent went: %v, want ErrGone", err)
	}
	recv(t, s.c.Done())
	if err := tmpl.Close(); err != nil {
		t.Errorf("closing a template of an agent that went: %v", err)
	}
	close(f.forkGate)
}

// A fork the fleet gave up on (its ctx ended) is cancelled; the clone the
// agent made all the same is ended, not left running.
func TestAgentEndsTheCloneOfAForkGivenUp(t *testing.T) {
	f := newFakeForker()
	f.forkGate = make(chan struct{})
	s := startSession(t, f)
	tmpl, err := s.c.Template(t.Context(), dom)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	forked := make(chan error, 1)
	go func() {
		_, err := tmpl.Fork(ctx)
		forked <- err
	}()
	recv(t, f.forking)
	cancel()
	if err := recv(t, forked); !errors.Is(err, context.Canceled) {
		t.Fatalf("fork given up: %v, want context.Canceled", err)
	}
	close(f.forkGate) // the fake forks regardless of the cancel
	if got := f.nextClosed(t); !strings.HasPrefix(got, tmpl.Name()+"-c") {
		t.Errorf("closed %q, want the late clone of %s", got, tmpl.Name())
	}
}

// Errors keep their kind across the session: the fleet branches on the
// same sentinels as for a local template.
func TestAgentErrorsKeepTheirKind(t *testing.T) {
	for _, want := range []error{vm.ErrBadTemplate, vm.ErrClosed, vm.ErrNotForkable} {
		t.Run(want.Error(), func(t *testing.T) {
			f := newFakeForker()
			f.forkErr = fmt.Errorf("template x: %w", want)
			s := startSession(t, f)
			tmpl, err := s.c.Template(t.Context(), dom)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tmpl.Fork(t.Context())
			if !errors.Is(err, want) || !strings.Contains(err.Error(), "host h1") {
				t.Errorf("fork: %v, want %v naming the host", err, want)
			}
		})
	}
}

// Malformed requests get an error reply naming what is wrong; the
// session goes on.
func TestAgentRefusesBadRequests(t *testing.T) {
	for _, tc := range []struct{ name, line, want string }{
		{"not json", `hello`, "not a JSON request object"},
		{"no id", `{"op":"hello"}`, "without an id"},
		{"no op", `{"id":1}`, "without an op"},
		{"unknown op", `{"id":1,"op":"reboot"}`, `unknown op "reboot"`},
		{"template without domain", `{"id":1,"op":"template"}`, `op "template" needs domain`},
		{"domain without overlay", `{"id":1,"op":"template","domain":{"name":"d","base":"/b","memory_mib":1}}`, "overlay path is empty"},
		{"domain without memory", `{"id":1,"op":"template","domain":{"name":"d","overlay":"/o","base":"/b"}}`, "memory_mib 0"},
		{"fork without template", `{"id":1,"op":"fork"}`, `op "fork" needs template`},
		{"prestart of none", `{"id":1,"op":"prestart","template":"t","n":0}`, "n 0: want 1-64"},
		{"end without clone", `{"id":1,"op":"end"}`, `op "end" needs clone`},
		{"forward without ports", `{"id":1,"op":"forward","clone":"c"}`, `op "forward" needs ports`},
		{"forward to port 0", `{"id":1,"op":"forward","clone":"c","ports":{"guest":1,"devtools":0,"vlc":3}}`, "must be a TCP port"},
		{"reserve port too big", `{"id":1,"op":"reserve","ports":{"guest":1,"devtools":2,"vlc":70000}}`, "must be a TCP port"},
		{"fork of an unknown template", `{"id":1,"op":"fork","template":"t"}`, `template "t"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			served := make(chan error, 1)
			go func() {
				served <- NewServer(newFakeForker(), nil).Serve(t.Context(), inR, outW)
				outW.Close()
			}()
			sc := bufio.NewScanner(outR)
			read := func() Reply {
				t.Helper()
				if !sc.Scan() {
					t.Fatalf("no reply: %v", sc.Err())
				}
				var r Reply
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatal(err)
				}
				return r
			}
			io.WriteString(inW, tc.line+"\n")
			if r := read(); !strings.Contains(r.Error, tc.want) || r.Kind == "" {
				t.Errorf("reply %+v: want an error of a kind containing %q", r, tc.want)
			}
			io.WriteString(inW, `{"id":9,"op":"hello"}`+"\n")
			if r := read(); r.ID != 9 || r.Hello == nil {
				t.Errorf("hello after a bad request: %+v", r)
			}
			inW.Close()
			if err := recv(t, served); err != nil {
				t.Error(err)
			}
		})
	}
}

// A line longer than any request ends the session with an error saying
// so; what the session made is ended all the same.
func TestAgentEndsAtAnOverlongLine(t *testing.T) {
	inR, inW := io.Pipe()
	served := make(chan error, 1)
	go func() { served <- NewServer(newFakeForker(), nil).Serve(t.Context(), inR, io.Discard) }()
	go func() {
		io.WriteString(inW, `{"id":1,"op":"hello","x":"`+strings.Repeat("a", maxLine)+"\"}\n")
	}()
	err := recv(t, served)
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("Serve: %v, want an error about the line's length", err)
	}
	inR.Close()
}

// recv receives from ch, failing the test after a minute: the waits here
// are for events, bounded so that a broken agent fails instead of hanging.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("nothing came within a minute")
		var zero T
		return zero
	}
}
