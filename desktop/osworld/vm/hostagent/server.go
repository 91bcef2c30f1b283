package hostagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// maxLine bounds a request line: requests are small, and a fleet that
// sends more is not speaking this protocol.
const maxLine = 64 << 10

// Forker is what the agent forks with: package vm on the host (Local), or
// a fake in tests.
type Forker interface {
	// Template takes a template of a domain of the host.
	Template(ctx context.Context, d vm.DomainRef) (Template, error)
	// Reserve keeps (on) or releases a parked VM's ports: no clone
	// started meanwhile takes them.
	Reserve(p vm.Ports, on bool)
	// Sweep removes the templates and clones a killed agent left and
	// names them.
	Sweep() ([]string, error)
	// ForkDir is where the templates go.
	ForkDir() string
}

// Template is one template of a Forker (vm.Template's methods).
type Template interface {
	Name() string
	Timings() vm.TemplateTimings
	Fork(ctx context.Context) (Clone, error)
	Prestart(ctx context.Context, n int) error
	CheckRAM(ctx context.Context) error
	Close() error
}

// Clone is one clone of a Template (vm.Clone's methods).
type Clone interface {
	Name() string
	Ports() vm.Ports
	PID() int
	Restore() time.Duration
	Started() (time.Duration, bool)
	Forward(ctx context.Context, p vm.Ports) error
	Close() error
}

// Server is the agent's side: it answers one fleet's requests until the
// fleet's stream ends, then ends everything it made.
type Server struct {
	forker Forker
	log    *slog.Logger

	wmu sync.Mutex // one reply line at a time
	enc *json.Encoder

	mu        sync.Mutex
	templates map[string]Template
	clones    map[string]Clone
	running   map[uint64]context.CancelFunc
	ending    bool
}

// NewServer returns a server that forks with f and logs to log (nil: no
// log).
func NewServer(f Forker, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{forker: f, log: log, templates: map[string]Template{}, clones: map[string]Clone{}, running: map[uint64]context.CancelFunc{}}
}

// Serve reads requests from r and writes replies to w until r ends (EOF,
// an error, a line that is too long) or ctx is done; then it cancels the
// requests still running, ends every clone and template it made and
// returns. It returns nil at EOF or when ctx ended, else why it stopped
// reading. Its reader ends with r: after a return for ctx, close r.
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	s.enc = json.NewEncoder(w)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The reader runs apart, so that ctx (a signal) ends the session
	// even while a read blocks.
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 4096), maxLine)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				readErr <- nil
				return
			}
		}
		readErr <- sc.Err()
	}()
	var wg sync.WaitGroup
	var err error
loop:
	for {
		select {
		case line := <-lines:
			s.handle(ctx, &wg, line)
		case err = <-readErr:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	if errors.Is(err, bufio.ErrTooLong) {
		err = fmt.Errorf("a request line is longer than %d bytes: not a fleet of this protocol", maxLine)
	}
	s.mu.Lock()
	s.ending = true
	for _, c := range s.running {
		c()
	}
	s.mu.Unlock()
	wg.Wait()
	s.endAll()
	return err
}

// handle starts one request; a malformed one is answered at once.
func (s *Server) handle(ctx context.Context, wg *sync.WaitGroup, line []byte) {
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		s.reply(Reply{ID: req.ID, Error: fmt.Sprintf("request %.80q is not a JSON request object: %v", line, err), Kind: KindBadRequest})
		return
	}
	if req.Op == OpCancel {
		s.mu.Lock()
		if c := s.running[req.Cancel]; c != nil {
			c()
		}
		s.mu.Unlock()
		return
	}
	if err := checkRequest(req); err != nil {
		s.reply(Reply{ID: req.ID, Error: err.Error(), Kind: KindBadRequest})
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if _, dup := s.running[req.ID]; dup || s.ending {
		s.mu.Unlock()
		cancel()
		s.reply(Reply{ID: req.ID, Error: fmt.Sprintf("request id %d is still running: give each request its own id", req.ID), Kind: KindBadRequest})
		return
	}
	s.running[req.ID] = cancel
	s.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		rep := s.do(rctx, req)
		s.mu.Lock()
		delete(s.running, req.ID)
		s.mu.Unlock()
		cancel()
		rep.ID = req.ID
		s.reply(rep)
	}()
}

// checkRequest says what is missing or wrong in a request, naming the
// field.
func checkRequest(r Request) error {
	if r.ID == 0 {
		return errors.New("request without an id: give each request an id above 0")
	}
	need := func(field string, ok bool) error {
		if !ok {
			return fmt.Errorf("op %q needs %s", r.Op, field)
		}
		return nil
	}
	switch r.Op {
	case OpHello, OpSweep:
		return nil
	case OpTemplate:
		if err := need("domain", r.Domain != nil); err != nil {
			return err
		}
		return r.Domain.Validate()
	case OpFork, OpCheck, OpDrop:
		return need("template", r.Template != "")
	case OpPrestart:
		if err := need("template", r.Template != ""); err != nil {
			return err
		}
		if r.N <= 0 || r.N > 64 {
			return fmt.Errorf("op %q: n %d: want 1-64 clones", r.Op, r.N)
		}
		return nil
	case OpEnd:
		return need("clone", r.Clone != "")
	case OpForward:
		if err := need("clone", r.Clone != ""); err != nil {
			return err
		}
		if err := need("ports", r.Ports != nil); err != nil {
			return err
		}
		return r.Ports.validate()
	case OpReserve:
		if err := need("ports", r.Ports != nil); err != nil {
			return err
		}
		return r.Ports.validate()
	case "":
		return errors.New("request without an op")
	}
	return fmt.Errorf("unknown op %q: want one of hello, template, fork, prestart, check, forward, end, drop, reserve, sweep, cancel", r.Op)
}

// do runs one request and returns its reply.
func (s *Server) do(ctx context.Context, req Request) Reply {
	fail := func(err error) Reply {
		if ctx.Err() != nil && !errors.Is(err, vm.ErrClosed) {
			return Reply{Error: fmt.Sprintf("%s cancelled: %v", req.Op, err), Kind: KindCancelled}
		}
		return Reply{Error: err.Error(), Kind: kindOf(err)}
	}
	switch req.Op {
	case OpHello:
		return Reply{Hello: &Hello{Version: Version, PID: os.Getpid(), ForkDir: s.forker.ForkDir()}}
	case OpSweep:
		swept, err := s.forker.Sweep()
		if err != nil {
			return Reply{Error: err.Error(), Swept: swept}
		}
		return Reply{Swept: swept}
	case OpReserve:
		s.forker.Reserve(req.Ports.vm(), req.On)
		return Reply{}
	case OpTemplate:
		t, err := s.forker.Template(ctx, *req.Domain)
		if err != nil {
			return fail(err)
		}
		if !s.keep(func() { s.templates[t.Name()] = t }) {
			t.Close()
			return fail(vm.ErrClosed)
		}
		s.log.Info("template taken", "template", t.Name(), "domain", req.Domain.Name)
		return Reply{Template: &TemplateInfo{Name: t.Name(), Timings: t.Timings()}}
	case OpEnd:
		c := s.clone(req.Clone, true)
		if c == nil {
			return fail(fmt.Errorf("%w: clone %q (ended already?)", ErrUnknown, req.Clone))
		}
		if err := c.Close(); err != nil {
			return fail(err)
		}
		return Reply{}
	case OpForward:
		c := s.clone(req.Clone, false)
		if c == nil {
			return fail(fmt.Errorf("%w: clone %q (ended already?)", ErrUnknown, req.Clone))
		}
		if err := c.Forward(ctx, req.Ports.vm()); err != nil {
			return fail(err)
		}
		return Reply{}
	}
	// The template operations.
	t := s.template(req.Template, req.Op == OpDrop)
	if t == nil {
		return fail(fmt.Errorf("%w: template %q (dropped already?)", ErrUnknown, req.Template))
	}
	switch req.Op {
	case OpDrop:
		var errs []error
		for _, c := range s.clonesOf(t.Name()) {
			errs = append(errs, c.Close())
		}
		if err := errors.Join(append(errs, t.Close())...); err != nil {
			return fail(err)
		}
		return Reply{}
	case OpCheck:
		if err := t.CheckRAM(ctx); err != nil {
			return fail(err)
		}
		return Reply{}
	case OpPrestart:
		if err := t.Prestart(ctx, req.N); err != nil {
			return fail(err)
		}
		return Reply{}
	case OpFork:
		c, err := t.Fork(ctx)
		if err != nil {
			return fail(err)
		}
		if !s.keep(func() { s.clones[c.Name()] = c }) {
			c.Close()
			return fail(vm.ErrClosed)
		}
		started, spare := c.Started()
		return Reply{Clone: &CloneInfo{Name: c.Name(), Ports: *wirePorts(c.Ports()), PID: c.PID(), Restore: c.Restore(), Started: started, Spare: spare}}
	}
	return fail(fmt.Errorf("%w: op %q", ErrBadRequest, req.Op))
}

// clone returns the clone of the name (nil: none), unlisted with remove.
func (s *Server) clone(name string, remove bool) Clone {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clones[name]
	if remove {
		delete(s.clones, name)
	}
	return c
}

// template returns the template of the name (nil: none), unlisted with
// remove.
func (s *Server) template(name string, remove bool) Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.templates[name]
	if remove {
		delete(s.templates, name)
	}
	return t
}

// clonesOf unlists and returns the clones of a template: vm names a
// template's clones TEMPLATE-cN.
func (s *Server) clonesOf(template string) []Clone {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Clone
	for name, c := range s.clones {
		if strings.HasPrefix(name, template+"-c") {
			out = append(out, c)
			delete(s.clones, name)
		}
	}
	return out
}

// keep runs set under mu unless the server is ending, and says whether
// it ran.
func (s *Server) keep(set func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ending {
		return false
	}
	set()
	return true
}

// endAll ends every clone, then every template, the fleet left.
func (s *Server) endAll() {
	s.mu.Lock()
	clones, templates := s.clones, s.templates
	s.clones, s.templates = map[string]Clone{}, map[string]Template{}
	s.mu.Unlock()
	for name, c := range clones {
		if err := c.Close(); err != nil {
			s.log.Warn("ending a clone the fleet left", "clone", name, "err", err)
		}
	}
	for name, t := range templates {
		if err := t.Close(); err != nil {
			s.log.Warn("dropping a template the fleet left", "template", name, "err", err)
		}
	}
	if len(clones)+len(templates) > 0 {
		s.log.Info("the fleet's session ended: ended what it left", "clones", len(clones), "templates", len(templates))
	}
}

// reply writes one reply line; a fleet that went away gets none.
func (s *Server) reply(r Reply) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.enc.Encode(r); err != nil {
		s.log.Debug("reply not written", "id", r.ID, "err", err)
	}
}
