package grade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"legato/rl/desktop"
)

// Defaults for PoolConfig's zero values.
const (
	// DefaultStartTimeout bounds a worker's start: the interpreter, then
	// importing every evaluator module of the checkout.
	DefaultStartTimeout = 2 * time.Minute
	// defaultCancelGrace is how long a worker lets a grade its caller gave
	// up on finish before it kills the process: most metrics take
	// milliseconds, and a warm process is worth keeping.
	defaultCancelGrace = 5 * time.Second
)

// DefaultWorkers is the pool size for this machine: one worker per CPU, at
// least 2, so that one slow grade does not hold up the others, and at most
// 8, since each worker holds every evaluator module and its dependencies
// (about 250 MB with pandas, OpenCV and scikit-image loaded).
func DefaultWorkers() int { return min(max(runtime.NumCPU(), 2), 8) }

// PoolConfig configures a Pool.
type PoolConfig struct {
	// OSWorldDir is the root of the OSWorld checkout whose evaluators the
	// workers run (it holds desktop_env/evaluators). Required.
	OSWorldDir string
	// Python is the interpreter; "" means DefaultPython. It needs the
	// packages OSWorld's evaluators import.
	Python string
	// Workers is the number of Python processes; 0 means DefaultWorkers().
	Workers int
	// BytecodeDir keeps the checkout's compiled modules across runs (by
	// their absolute path, so one directory serves every checkout); ""
	// means legato/pycache in the user's cache directory. The rest of the
	// interpreter uses the bytecode its distribution ships.
	BytecodeDir string
	// StartTimeout bounds a worker's start, imports included; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Logger receives the workers' lifecycle and their evaluators' output
	// (at debug level); nil discards.
	Logger *slog.Logger
}

// Validate reports whether the configuration can work, naming what to fix.
func (c *PoolConfig) Validate() error {
	if c.OSWorldDir == "" {
		return errors.New("grader pool: no OSWorld checkout: set OSWorldDir")
	}
	st, err := os.Stat(filepath.Join(c.OSWorldDir, "desktop_env", "evaluators"))
	if err != nil || !st.IsDir() {
		return fmt.Errorf("grader pool: %q has no desktop_env/evaluators: give the root of an OSWorld checkout", c.OSWorldDir)
	}
	if c.Workers < 0 {
		return fmt.Errorf("grader pool: %d workers: want 1 or more (0 means %d for this machine)", c.Workers, DefaultWorkers())
	}
	if c.StartTimeout < 0 {
		return fmt.Errorf("grader pool: negative start timeout %v", c.StartTimeout)
	}
	return nil
}

// Interpreter says which Python runs the evaluators.
type Interpreter struct {
	// Command is the interpreter as configured ("python3").
	Command string `json:"command"`
	// Path is where the command was found on PATH.
	Path string `json:"path"`
	// Executable is the interpreter that runs, as Python reports it
	// (sys.executable): a version manager's shim resolved. "" until a
	// worker started.
	Executable string `json:"executable"`
	// Version is Python's version ("3.11.2"); "" until a worker started.
	Version string `json:"version"`
}

// PoolStats describes a pool's processes.
type PoolStats struct {
	// Workers is the pool's size.
	Workers int
	// Running is how many worker processes are alive.
	Running int
	// Starts counts the processes started, replacements included.
	Starts int
	// RSS is the resident memory of each running process, in bytes; nil
	// where /proc cannot tell.
	RSS []int64
}

// Pool is a few long-lived Python processes running an OSWorld checkout's
// evaluators for every grader of a batch. It starts them when it is made,
// one first and the others once it is up (they then read the bytecode it
// compiled), and each imports every evaluator module before taking work,
// so grades never wait for imports. A grade goes to the first free worker.
// A worker whose process crashes or hangs past the grade's timeout is
// replaced, and the grade it was running gets one more try on the next
// free worker. Each worker runs in a working directory of its own, so
// metrics that write relative paths do not collide. Its methods are safe
// for concurrent use.
type Pool struct {
	cfg      PoolConfig
	log      *slog.Logger
	checkout string
	bytecode string
	dir      string // bridge.py and the workers' working directories
	script   string
	// lazy pools start their worker at the first call (a grader's own).
	lazy        bool
	cancelGrace time.Duration

	calls      chan *call
	retries    chan *call
	life       context.Context
	stop       context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
	firstReady chan struct{} // the first worker's first start ended

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when a worker's process starts or stops
	python  string        // what to run: cfg.Python, then the resolved executable
	info    Interpreter
	workers []*worker
	starts  int
	lists   *evaluatorLists // the first listing of the checkout
}

// evaluatorLists are the checkout's getters and metrics: name → "" when it
// imports, else why not; missing names the module a name lacks.
type evaluatorLists struct {
	metrics, getters, missing map[string]string
}

// call is one request waiting for, or held by, a worker.
type call struct {
	ctx     context.Context // the caller's; a call it gave up on is dropped
	req     *bridgeRequest
	timeout time.Duration
	tries   int
	res     chan callResult // buffered: a worker never waits for the caller
}

type callResult struct {
	ans *bridgeAnswer
	err error
}

func (c *call) reply(ans *bridgeAnswer, err error) { c.res <- callResult{ans, err} }

// NewPool starts a pool's workers and returns without waiting for them.
// Close stops them.
func NewPool(cfg PoolConfig) (*Pool, error) {
	return newPool(cfg, false)
}

func newPool(cfg PoolConfig, lazy bool) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Python == "" {
		cfg.Python = DefaultPython
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers()
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	path, err := exec.LookPath(cfg.Python)
	if err != nil {
		return nil, fmt.Errorf("grader pool: Python interpreter %q: %w (set the interpreter with --python or GraderConfig.Python)", cfg.Python, err)
	}
	checkout, err := filepath.Abs(cfg.OSWorldDir)
	if err != nil {
		return nil, err
	}
	bytecode := cfg.BytecodeDir
	if bytecode == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		bytecode = filepath.Join(base, "legato", "pycache")
	}
	if bytecode, err = filepath.Abs(bytecode); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "legato-grader-")
	if err != nil {
		return nil, fmt.Errorf("grader pool: %w", err)
	}
	script := filepath.Join(dir, "bridge.py")
	if err := os.WriteFile(script, bridgeSource, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("grader pool: write bridge: %w", err)
	}
	p := &Pool{
		cfg:         cfg,
		log:         cfg.Logger,
		checkout:    checkout,
		bytecode:    bytecode,
		dir:         dir,
		script:      script,
		lazy:        lazy,
		cancelGrace: defaultCancelGrace,
		calls:       make(chan *call),
		retries:     make(chan *call, cfg.Workers),
		firstReady:  make(chan struct{}),
		python:      cfg.Python,
		info:        Interpreter{Command: cfg.Python, Path: path},
		changed:     make(chan struct{}),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.life, p.stop = context.WithCancel(context.Background())
	for i := range cfg.Workers {
		w := &worker{p: p, id: i, dir: filepath.Join(dir, "worker-"+strconv.Itoa(i))}
		if err := os.Mkdir(w.dir, 0o755); err != nil {
			p.Close()
			return nil, fmt.Errorf("grader pool: %w", err)
		}
		p.workers = append(p.workers, w)
	}
	for _, w := range p.workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			w.run()
		}()
	}
	return p, nil
}

// Close kills every worker process, with what it started, and waits for
// them; grades in flight return desktop.ErrClosed. It is idempotent.
func (p *Pool) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.stop()
		p.wg.Wait()
		err = os.RemoveAll(p.dir)
	})
	return err
}

// Checkout returns the absolute path of the pool's OSWorld checkout.
func (p *Pool) Checkout() string { return p.checkout }

// Interpreter says which Python the workers run; Executable and Version
// are known once a worker started.
func (p *Pool) Interpreter() Interpreter {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// Stats describes the pool's processes now.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	s := PoolStats{Workers: len(p.workers), Starts: p.starts}
	workers := p.workers
	p.mu.Unlock()
	for _, w := range workers {
		pid := int(w.pid.Load())
		if pid == 0 {
			continue
		}
		s.Running++
		if rss, ok := residentBytes(pid); ok {
			s.RSS = append(s.RSS, rss)
		}
	}
	return s
}

// workerChanged wakes waitStats.
func (p *Pool) workerChanged() {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// waitRunning waits until every worker has a warm process.
func (p *Pool) waitRunning(ctx context.Context) error {
	return p.waitStats(ctx, func(st PoolStats) bool { return st.Running == st.Workers })
}

// waitStats waits until the pool's stats satisfy cond, looking again at
// each change of a worker.
func (p *Pool) waitStats(ctx context.Context, cond func(PoolStats) bool) error {
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		if cond(p.Stats()) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// do runs one request on the first free worker. timeout bounds the
// request on a worker (a worker that fails it is replaced and the request
// tried once more).
func (p *Pool) do(ctx context.Context, req *bridgeRequest, timeout time.Duration) (*bridgeAnswer, error) {
	if p.life.Err() != nil {
		return nil, desktop.ErrClosed
	}
	c := &call{ctx: ctx, req: req, timeout: timeout, res: make(chan callResult, 1)}
	select {
	case p.calls <- c:
	case <-ctx.Done():
		return nil, fmt.Errorf("grader: %w", ctx.Err())
	case <-p.life.Done():
		return nil, desktop.ErrClosed
	}
	select {
	case r := <-c.res:
		return r.ans, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("grader: %w", ctx.Err())
	case <-p.life.Done():
		return nil, desktop.ErrClosed
	}
}

// evaluators lists the checkout's getters and metrics: the listing a
// worker made when it started, or a new one.
func (p *Pool) evaluators(ctx context.Context) (*evaluatorLists, error) {
	if !p.lazy {
		select {
		case <-p.firstReady:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.life.Done():
			return nil, desktop.ErrClosed
		}
	}
	p.mu.Lock()
	lists := p.lists
	p.mu.Unlock()
	if lists != nil {
		return lists, nil
	}
	ans, err := p.do(ctx, &bridgeRequest{Op: "list"}, p.cfg.StartTimeout)
	if err != nil {
		return nil, fmt.Errorf("list evaluators of %s: %w", p.checkout, err)
	}
	if ans.Error != "" {
		return nil, fmt.Errorf("list evaluators of %s: %s", p.checkout, ans.Error)
	}
	return p.keepLists(ans), nil
}

// keepLists keeps the first listing and returns the one kept.
func (p *Pool) keepLists(ans *bridgeAnswer) *evaluatorLists {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lists != nil {
		return p.lists
	}
	conv := func(in map[string]*string, prefix string) map[string]string {
		out := make(map[string]string, len(in))
		for name, reason := range in {
			if prefix != "" {
				var ok bool
				if name, ok = strings.CutPrefix(name, prefix); !ok {
					continue
				}
			}
			out[name] = ""
			if reason != nil {
				out[name] = *reason
			}
		}
		return out
	}
	missing := make(map[string]string, len(ans.Missing))
	for name, module := range ans.Missing {
		if n, ok := strings.CutPrefix(name, "get_"); ok {
			name = n
		}
		missing[name] = module
	}
	p.lists = &evaluatorLists{metrics: conv(ans.Metrics, ""), getters: conv(ans.Getters, "get_"), missing: missing}
	return p.lists
}

// spawnSpec is how the next worker process starts.
func (p *Pool) spawnSpec(dir string) bridgeSpec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bridgeSpec{python: p.python, script: p.script, checkout: p.checkout, bytecode: p.bytecode, dir: dir, log: p.log}
}

// started records a process that answered ready. Later processes run the
// interpreter it reports directly: a version manager's shim costs time on
// every start.
func (p *Pool) started(ans *bridgeAnswer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.info.Executable == "" && ans.Executable != "" {
		p.info.Executable, p.info.Version = ans.Executable, ans.Python
		if _, err := os.Stat(ans.Executable); err == nil {
			p.python = ans.Executable
		}
	}
}

// worker owns one Python process at a time: it starts it, hands it
// requests, and replaces it when it dies or hangs.
type worker struct {
	p    *Pool
	id   int
	dir  string
	proc *bridgeProc // touched by the worker's goroutine only
	pid  atomic.Int64
}

func (w *worker) run() {
	p := w.p
	defer w.stopProcess()
	if !p.lazy {
		if w.id > 0 {
			select {
			case <-p.firstReady:
			case <-p.life.Done():
				return
			}
		}
		if err := w.start(); err != nil && p.life.Err() == nil {
			p.log.Error("grader worker did not start; it will try again at its first grade", "worker", w.id, "err", err)
		}
		if w.id == 0 {
			close(p.firstReady)
		}
	}
	for {
		var c *call
		select {
		case c = <-p.retries:
		case c = <-p.calls:
		case <-p.life.Done():
			return
		}
		w.serve(c)
	}
}

func (w *worker) stopProcess() {
	if w.proc != nil {
		w.proc.kill()
		w.proc = nil
		w.pid.Store(0)
		w.p.workerChanged()
	}
}

// start makes sure the worker has a running, warm process: started, and
// (but in a lazy pool) every evaluator module imported, by the listing kept
// as the pool's catalog.
func (w *worker) start() error {
	if w.proc != nil && !w.proc.exited() {
		return nil
	}
	w.stopProcess()
	p := w.p
	began := time.Now()
	proc, err := startBridge(p.spawnSpec(w.dir))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.starts++
	p.mu.Unlock()
	deadline := time.NewTimer(p.cfg.StartTimeout)
	defer deadline.Stop()
	ans, err := proc.recv(deadline.C, p.life.Done())
	if err == nil && !ans.Ready {
		err = fmt.Errorf("%w: unexpected first line from the bridge", ErrBridgeExited)
	}
	if err == nil && p.lazy {
		// A grader's own pool serves one desktop: it imports a module when
		// a grade first needs it, as a lone process should.
		p.started(ans)
	} else if err == nil {
		p.started(ans)
		err = proc.send(&bridgeRequest{Op: "list"}, p.cfg.StartTimeout)
		if err == nil {
			var list *bridgeAnswer
			if list, err = proc.answer(proc.nextID, deadline.C, p.life.Done()); err == nil && list.Error == "" {
				p.keepLists(list)
			}
		}
	}
	if err != nil {
		proc.kill()
		switch {
		case errors.Is(err, errStopped):
			err = desktop.ErrClosed
		case errors.Is(err, ErrTimeout):
			err = fmt.Errorf("%w: the grader did not start and import the checkout's evaluators within %v", ErrTimeout, p.cfg.StartTimeout)
		case proc.exited():
			err = proc.exitError()
		}
		return fmt.Errorf("start grader: %w", err)
	}
	w.proc = proc
	w.pid.Store(int64(proc.pid()))
	p.workerChanged()
	p.log.Info("grader worker ready", "worker", w.id, "pid", proc.pid(), "python", ans.Python, "checkout", p.checkout, "took", time.Since(began))
	return nil
}

// serve runs c on the worker's process.
func (w *worker) serve(c *call) {
	p := w.p
	if err := c.ctx.Err(); err != nil {
		c.reply(nil, err) // the caller gave up while the call waited
		return
	}
	if err := w.start(); err != nil {
		c.reply(nil, err)
		return
	}
	ans, err := w.exchange(c)
	switch {
	case err == nil:
		c.reply(ans, nil)
		return
	case errors.Is(err, desktop.ErrClosed):
		c.reply(nil, err)
		return
	case c.ctx.Err() != nil:
		c.reply(nil, err) // given up; the process was killed after a grace
	case c.tries == 0:
		p.log.Warn("grader worker failed a grade; replacing it and trying the grade once more", "worker", w.id, "op", c.req.Op, "metric", c.req.Metric, "err", err)
		c.tries++
		p.retries <- c // room for one per worker: never blocks
	default:
		c.reply(nil, fmt.Errorf("%w (the second try; the first failed the same way on another process)", err))
	}
	w.stopProcess()
	if err := w.start(); err != nil && p.life.Err() == nil {
		p.log.Error("grader worker did not restart; it will try again at its next grade", "worker", w.id, "err", err)
	}
}

// exchange sends c's request and waits for its answer. It kills the
// process when the request's timeout passes, when the pool closes, and a
// grace period after the caller gave up.
func (w *worker) exchange(c *call) (*bridgeAnswer, error) {
	proc := w.proc
	if err := proc.send(c.req, c.timeout); err != nil {
		// The process is gone or not reading; its end says why.
		w.p.log.Debug("grader bridge: write request", "err", err)
	}
	id := c.req.ID
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	gaveUp := c.ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case line, ok := <-proc.lines:
			ans, err := proc.decode(line, ok)
			if err != nil {
				return nil, err
			}
			if ans.ID != nil && *ans.ID == id {
				return ans, nil
			}
		case <-deadline.C:
			w.p.log.Warn("grader timed out; killing its process", "worker", w.id, "metric", c.req.Metric, "timeout", c.timeout)
			proc.kill()
			return nil, fmt.Errorf("%w: no answer after %v; killed the grader process", ErrTimeout, c.timeout)
		case <-w.p.life.Done():
			proc.kill()
			return nil, desktop.ErrClosed
		case <-gaveUp:
			gaveUp = nil
			t := time.NewTimer(w.p.cancelGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			proc.kill()
			return nil, c.ctx.Err()
		}
	}
}

// residentBytes returns a process's resident set size from /proc.
func residentBytes(pid int) (int64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, false
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(data), &size, &resident); err != nil {
		return 0, false
	}
	return resident * int64(os.Getpagesize()), true
}
