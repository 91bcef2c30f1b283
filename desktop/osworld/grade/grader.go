package grade

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"legato/rl/desktop"
)

// Defaults for GraderConfig's zero values.
const (
	DefaultPython  = "python3"
	DefaultTimeout = 2 * time.Minute
	DefaultHost    = "127.0.0.1"
)

// PostConfig runs the postconfig steps of task's evaluator with the
// desktop's setup controller. cacheDir is the task's cache directory: a step
// that writes on the host (an execute step's "stdout" file) writes there,
// where cache_file getters look. With setup.Controller:
//
//	func(ctx context.Context, task desktop.Task, steps []desktop.SetupStep, cacheDir string) error {
//		c := *ctrl
//		c.OutputDir = cacheDir
//		return c.Run(ctx, task, steps)
//	}
type PostConfig func(ctx context.Context, task desktop.Task, steps []desktop.SetupStep, cacheDir string) error

// Env is what OSWorld's getters know about the desktop, as seen from the
// host: the forwarded ports of its guest server, Chrome DevTools and VLC.
type Env struct {
	// Host is where the ports are forwarded; "" means 127.0.0.1.
	Host string
	// ServerPort is the guest server's port (5000 in the guest).
	ServerPort int
	// ChromiumPort is Chrome's DevTools port (9222 in the guest).
	ChromiumPort int
	// VLCPort is VLC's HTTP interface (8080 in the guest).
	VLCPort int
	// Platform is what env.vm_platform returns ("Linux"); "" asks the
	// guest each time a getter reads it, as OSWorld does.
	Platform string
}

// GraderConfig configures a Grader. The zero value grades natively, with
// the defaults below.
type GraderConfig struct {
	// Pool runs OSWorld's Python evaluators, shared with the batch's other
	// graders; Close leaves it running. With none, a grader that has an
	// OSWorldDir starts a pool of its own, of one worker, at its first
	// grade through Python.
	Pool *Pool
	// OSWorldDir is the root of an OSWorld checkout (it holds
	// desktop_env/evaluators): Pool's, or the one a pool of the grader's
	// own runs. "" and no Pool grades natively only.
	OSWorldDir string
	// Python is the interpreter of the grader's own pool; "" means
	// DefaultPython. It needs the packages OSWorld's evaluators import.
	Python string
	// BytecodeDir is PoolConfig.BytecodeDir for the grader's own pool.
	BytecodeDir string
	// Mode chooses between OSWorld's Python and native code for metrics
	// both can run.
	Mode Mode
	// Timeout bounds each metric with its getters (a metric a worker
	// process fails gets a second try, with a second Timeout), and the
	// start of the grader's own pool; 0 means DefaultTimeout.
	Timeout time.Duration
	// CacheDir is this grader's own directory: per-task cache directories
	// (OSWorld's env.cache_dir) live under it. Give each desktop its own.
	// "" uses a temporary directory removed by Close.
	CacheDir string
	// DownloadDir caches cloud_file downloads by URL and may be shared by
	// graders; "" means CacheDir/downloads.
	DownloadDir string
	// Env locates the desktop's forwarded ports for the bridge's getters.
	Env Env
	// Guest serves the native getters that read the desktop (vm_file,
	// vm_command_line, accessibility_tree).
	Guest Guest
	// PostConfig runs evaluator postconfig steps; a task with postconfig
	// steps is refused without it. To re-grade a stored desktop state whose
	// postconfig already ran, pass a function that does nothing.
	PostConfig PostConfig
	// HTTPClient downloads cloud files; nil means http.DefaultClient.
	HTTPClient *http.Client
	// Catalog, from LoadCatalog, says where each metric runs. nil: the
	// grader lists its checkout itself on first use.
	Catalog *Catalog
	// Logger receives the bridge's lifecycle and its evaluators' output
	// (at debug level); nil discards.
	Logger *slog.Logger
}

// Validate reports whether the configuration can work, naming what to fix.
func (c *GraderConfig) Validate() error {
	if c.Mode < PreferBridge || c.Mode > NativeOnly {
		return fmt.Errorf("grader: unknown mode %d", c.Mode)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("grader: negative timeout %v", c.Timeout)
	}
	for _, p := range []struct {
		name string
		port int
	}{{"server", c.Env.ServerPort}, {"chromium", c.Env.ChromiumPort}, {"vlc", c.Env.VLCPort}} {
		if p.port < 0 || p.port > 65535 {
			return fmt.Errorf("grader: %s port %d out of range", p.name, p.port)
		}
	}
	python := (c.OSWorldDir != "" || c.Pool != nil) && c.Mode != NativeOnly
	if c.Catalog != nil && c.Catalog.checkout != "" && !python {
		return fmt.Errorf("grader: the catalog lists the checkout %q but the grader runs no Python: set OSWorldDir or Pool", c.Catalog.checkout)
	}
	if c.Pool != nil && c.OSWorldDir != "" {
		if dir, err := filepath.Abs(c.OSWorldDir); err != nil || dir != c.Pool.Checkout() {
			return fmt.Errorf("grader: OSWorldDir %q is not the checkout of the pool (%s): leave OSWorldDir empty or give the same one", c.OSWorldDir, c.Pool.Checkout())
		}
	}
	if c.Pool == nil && c.OSWorldDir != "" && c.Mode != NativeOnly {
		st, err := os.Stat(filepath.Join(c.OSWorldDir, "desktop_env", "evaluators"))
		if err != nil || !st.IsDir() {
			return fmt.Errorf("grader: %q has no desktop_env/evaluators: give the root of an OSWorld checkout", c.OSWorldDir)
		}
	}
	return nil
}

// Grader grades tasks on one desktop with OSWorld's evaluation semantics.
// Its methods are not safe for concurrent use, except Close, which may be
// called at any time and makes a running Grade return promptly.
type Grader struct {
	cfg      GraderConfig
	log      *slog.Logger
	root     string // CacheDir or our temporary directory
	tempRoot bool
	download string
	client   *http.Client
	// guestHTTP reaches the guest's own ports (VLC, DevTools): no proxy,
	// no connection kept past a request.
	guestHTTP *http.Client
	timeout   time.Duration
	pool      *Pool // nil without a checkout or in NativeOnly mode
	ownPool   bool  // the pool is the grader's, closed with it
	now       func() time.Time

	catMu   sync.Mutex
	catalog *Catalog

	closed    atomic.Bool
	closeOnce sync.Once
	// life is cancelled by Close, so that a running Grade returns promptly.
	life    context.Context
	endLife context.CancelFunc

	// extraMetrics lets tests add native metrics with scripted scores.
	extraMetrics map[string]nativeMetric
}

// New returns a grader. It starts nothing: a pool of its own starts on the
// first grade that needs Python.
func New(cfg GraderConfig) (*Grader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Grader{
		cfg:     cfg,
		log:     cfg.Logger,
		client:  cfg.HTTPClient,
		timeout: cfg.Timeout,
		now:     time.Now,
		catalog: cfg.Catalog,
	}
	g.life, g.endLife = context.WithCancel(context.Background())
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.client == nil {
		g.client = http.DefaultClient
	}
	g.guestHTTP = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	if g.timeout == 0 {
		g.timeout = DefaultTimeout
	}
	g.root = cfg.CacheDir
	if g.root == "" {
		dir, err := os.MkdirTemp("", "legato-grade-")
		if err != nil {
			return nil, fmt.Errorf("grader cache dir: %w", err)
		}
		g.root, g.tempRoot = dir, true
	}
	g.download = cfg.DownloadDir
	if g.download == "" {
		g.download = filepath.Join(g.root, "downloads")
	}
	// Paths handed to Python must not depend on a working directory: the
	// workers run in their own.
	var err error
	if g.root, err = filepath.Abs(g.root); err != nil {
		return nil, fmt.Errorf("grader cache dir: %w", err)
	}
	if g.download, err = filepath.Abs(g.download); err != nil {
		return nil, fmt.Errorf("grader download dir: %w", err)
	}
	switch {
	case cfg.Mode == NativeOnly:
	case cfg.Pool != nil:
		g.pool = cfg.Pool
	case cfg.OSWorldDir != "":
		p, err := newPool(PoolConfig{
			OSWorldDir: cfg.OSWorldDir, Python: cfg.Python, Workers: 1, BytecodeDir: cfg.BytecodeDir,
			StartTimeout: g.timeout, Logger: g.log,
		}, true)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.pool, g.ownPool = p, true
	}
	return g, nil
}

// Close stops the grader's own pool, if it has one (a shared Pool keeps
// running), and removes the temporary directory, if the grader made one.
// It is idempotent.
func (g *Grader) Close() error {
	var err error
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		g.endLife()
		if g.ownPool {
			g.pool.Close()
		}
		if g.tempRoot {
			err = os.RemoveAll(g.root)
		}
	})
	return err
}

// How a metric ran, as desktop.MetricRun.Via says.
const (
	// ViaNative is legato's Go version of the metric and its getters.
	ViaNative = "native"
	// ViaPython is OSWorld's own Python code, run by a worker of the pool.
	ViaPython = "python"
)

// Result is a grade: the reward, and how each metric that ran was
// computed, in order. A list of metrics that stopped early ("and" at a 0,
// "or" at a 1) lists only those that ran; a metric that failed the grade
// is the last.
type Result struct {
	Score   float64
	Metrics []desktop.MetricRun
}

// Grade is Evaluate's reward.
func (g *Grader) Grade(ctx context.Context, task desktop.Task, lastAction desktop.Action) (float64, error) {
	r, err := g.Evaluate(ctx, task, lastAction)
	return r.Score, err
}

// Evaluate runs task's evaluator on the desktop as OSWorld's
// DesktopEnv.evaluate does and returns the reward in [0, 1] with how each
// metric ran:
//
//   - the postconfig steps run first;
//   - "infeasible" scores 1 exactly when lastAction is FAIL;
//   - otherwise a final FAIL scores 0 without grading;
//   - one metric scores metric(result[, expected], **options);
//   - a list scores 0 at the first metric scoring 0 ("and"; else the mean)
//     or 1 at the first scoring 1 ("or"; else the maximum);
//   - a result getter that finds no file scores 0 for its metric.
//
// lastAction is the attempt's last action (the zero Action when it took
// none). An error wrapping desktop.ErrUnsupported means the task cannot be
// graded here; any other error (an *Error naming the metric) is a failure
// of the desktop or of its grader.
func (g *Grader) Evaluate(ctx context.Context, task desktop.Task, lastAction desktop.Action) (Result, error) {
	return g.evaluate(ctx, task, lastAction, true)
}

// EvaluateAgain grades the desktop's state once more as Evaluate did, its
// getters and metrics, without the postconfig steps (they ran, and they
// may change the state): a grader that gives another reward for the same
// state disagrees with itself. What the last Evaluate's postconfig steps
// wrote on the host (an execute step's output file) is graded again as
// they left it; for a task with postconfig steps, EvaluateAgain before any
// Evaluate of it on this grader fails.
func (g *Grader) EvaluateAgain(ctx context.Context, task desktop.Task, lastAction desktop.Action) (Result, error) {
	return g.evaluate(ctx, task, lastAction, false)
}

func (g *Grader) evaluate(ctx context.Context, task desktop.Task, lastAction desktop.Action, postconfig bool) (Result, error) {
	if g.closed.Load() {
		return Result{}, desktop.ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.life, cancel)
	defer stop()
	var runs []desktop.MetricRun
	s, err := g.grade(ctx, task, lastAction, postconfig, &runs)
	if err != nil && g.closed.Load() {
		err = desktop.ErrClosed
	}
	if err != nil {
		s = 0
	}
	return Result{Score: s, Metrics: runs}, err
}

func (g *Grader) grade(ctx context.Context, task desktop.Task, lastAction desktop.Action, postconfig bool, runs *[]desktop.MetricRun) (float64, error) {
	ev, err := ParseEvaluator(task.Evaluator)
	if err != nil {
		return 0, &UnsupportedError{TaskID: task.ID, Reason: err.Error()}
	}
	var runners []runner
	if !ev.Infeasible {
		cat, err := g.loadCatalog(ctx)
		if err != nil {
			return 0, &Error{TaskID: task.ID, Op: "bridge", Err: err}
		}
		if runners, err = cat.plan(task.ID, ev, g.extraMetrics); err != nil {
			return 0, err
		}
		if err := g.checkRunnable(task.ID, ev, runners); err != nil {
			return 0, err
		}
	}
	if len(ev.PostConfig) > 0 && g.cfg.PostConfig == nil && postconfig {
		return 0, &UnsupportedError{TaskID: task.ID, Reason: "the evaluator has postconfig steps and the grader has no PostConfig"}
	}

	// A fresh directory per grade, so that a file an earlier attempt left
	// (a postconfig output, a copied guest file) is never graded again.
	cacheDir := filepath.Join(g.root, "tasks", safeName(task.ID))
	if err := emptyDir(cacheDir); err != nil {
		return 0, &Error{TaskID: task.ID, Op: "cache dir", Err: err}
	}

	if len(ev.PostConfig) > 0 {
		if err := g.postConfig(ctx, task, ev.PostConfig, cacheDir, postconfig); err != nil {
			return 0, err
		}
	}
	if ev.Infeasible {
		return score(lastAction.Kind == desktop.Fail), nil
	}
	if lastAction.Kind == desktop.Fail {
		return 0, nil
	}

	var results []float64
	for i, m := range ev.Metrics {
		via := ViaNative
		if runners[i] == runBridge {
			via = ViaPython
		}
		*runs = append(*runs, desktop.MetricRun{Metric: m.Func, Via: via, ResultGetter: m.Result.Type})
		var in inputs
		s, err := g.runMetric(ctx, task.ID, i, m, runners[i], cacheDir, &in)
		if err == nil {
			r := &(*runs)[len(*runs)-1]
			r.Result, r.Expected, r.ResultValue = in.result, in.expected, shown(in.shown)
		}
		var nr *noResultFile
		if errors.As(err, &nr) {
			g.log.Info("grade: result file not found; the metric scores 0", "task", task.ID, "metric", m.Func, "err", err)
			s, err = 0, nil
		}
		if err != nil {
			return 0, err
		}
		if !ev.List {
			return s, nil
		}
		switch {
		case ev.Conj == And && s == 0:
			return 0, nil
		case ev.Conj == Or && s == 1:
			return 1, nil
		}
		results = append(results, s)
	}
	if ev.Conj == And {
		sum := 0.0
		for _, s := range results {
			sum += s
		}
		return sum / float64(len(results)), nil
	}
	best := results[0]
	for _, s := range results[1:] {
		best = max(best, s)
	}
	return best, nil
}

// postConfig runs the postconfig steps, writing into cacheDir, and keeps a
// copy of what they wrote there; with run false it puts back instead what
// the last run for the task kept. An execute step's output file is part of
// the state graded, and no getter fetches it again: grading again without
// it would score what is no longer there.
func (g *Grader) postConfig(ctx context.Context, task desktop.Task, steps []desktop.SetupStep, cacheDir string, run bool) error {
	kept := filepath.Join(g.root, "postconfig", safeName(task.ID))
	if !run {
		if _, err := os.Stat(kept); errors.Is(err, fs.ErrNotExist) {
			return &Error{TaskID: task.ID, Op: "postconfig", Err: errors.New("this grader has not run the task's postconfig steps: grade it with Evaluate before EvaluateAgain")}
		}
		if err := os.CopyFS(cacheDir, os.DirFS(kept)); err != nil {
			return &Error{TaskID: task.ID, Op: "restore postconfig output", Err: err}
		}
		return nil
	}
	// An earlier run's copy goes first: a run that fails keeps nothing.
	if err := os.RemoveAll(kept); err != nil {
		return &Error{TaskID: task.ID, Op: "keep postconfig output", Err: err}
	}
	if err := g.cfg.PostConfig(ctx, task, steps, cacheDir); err != nil {
		return &Error{TaskID: task.ID, Op: "postconfig", Err: err}
	}
	if err := os.CopyFS(kept, os.DirFS(cacheDir)); err != nil {
		return &Error{TaskID: task.ID, Op: "keep postconfig output", Err: err}
	}
	return nil
}

// checkRunnable refuses what the catalog cannot know about: native getters
// that need a guest when the grader has none.
func (g *Grader) checkRunnable(taskID string, ev *Evaluator, runners []runner) error {
	for i, m := range ev.Metrics {
		if runners[i] != runNative {
			continue
		}
		for _, gt := range m.getters() {
			if getterNeedsGuest(gt.Type) && g.cfg.Guest == nil {
				return &UnsupportedError{TaskID: taskID, Metric: m.Func, Getter: gt.Type, Reason: "the grader has no Guest to read the desktop"}
			}
			if port, ok := g.getterPort(gt.Type); ok && port == 0 {
				return &UnsupportedError{TaskID: taskID, Metric: m.Func, Getter: gt.Type,
					Reason: "the desktop has no forward of the guest's port it reads (for --guest-url, add ,vlc=PORT or ,devtools=PORT)"}
			}
		}
	}
	return nil
}

// getterPort returns the guest port a native getter connects to, if any.
func (g *Grader) getterPort(typ string) (int, bool) {
	switch typ {
	case "vlc_playing_info":
		return g.cfg.Env.VLCPort, true
	case "open_tabs_info":
		return g.cfg.Env.ChromiumPort, true
	}
	return 0, false
}

// loadCatalog returns the grader's catalog, listing its checkout through
// the bridge the first time when none was given.
func (g *Grader) loadCatalog(ctx context.Context) (*Catalog, error) {
	g.catMu.Lock()
	defer g.catMu.Unlock()
	if g.catalog != nil {
		return g.catalog, nil
	}
	if g.pool == nil {
		g.catalog = &Catalog{mode: g.cfg.Mode}
		return g.catalog, nil
	}
	lists, err := g.pool.evaluators(ctx)
	if err != nil {
		return nil, err
	}
	g.catalog = newCatalog(g.cfg.Mode, g.pool.Checkout(), lists)
	return g.catalog, nil
}

// noResultFile marks a result getter that found no file; OSWorld scores
// the metric 0 then.
type noResultFile struct{ err error }

func (e *noResultFile) Error() string { return e.err.Error() }
func (e *noResultFile) Unwrap() error { return e.err }

// runMetric runs one metric with its getters and returns its score; in
// gets the digests of what the metric was given.
func (g *Grader) runMetric(parent context.Context, taskID string, index int, m Metric, where runner, cacheDir string, in *inputs) (float64, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeoutCause(parent, g.timeout, ErrTimeout)
	defer cancel()
	env := &nativeEnv{guest: g.cfg.Guest, ports: g.cfg.Env, guestHTTP: g.guestHTTP, cacheDir: cacheDir,
		client: g.client, now: g.now, downloads: g.download}

	s, err := func() (float64, error) {
		// Cloud files are fetched here for the bridge too (Python's getter
		// then finds them in place): one download path, one HTTP client,
		// one cache.
		for _, gt := range m.getters() {
			if gt.Type != "cloud_file" {
				continue
			}
			cfg, err := getterConfig(gt.Getter)
			if err != nil {
				return 0, &Error{Op: gt.op(), Err: err}
			}
			if _, err := getCloudFile(ctx, env, cfg); err != nil {
				return 0, &Error{Op: gt.op(), Err: err}
			}
		}
		if where == runBridge {
			deadline, _ := ctx.Deadline()
			return g.bridgeMetric(parent, time.Until(deadline), m, cacheDir, in)
		}
		return g.nativeMetric(ctx, env, m, in)
	}()
	var ge *Error
	if errors.As(err, &ge) {
		ge.TaskID, ge.Metric, ge.Index = taskID, m.Func, index
		if errors.Is(context.Cause(ctx), ErrTimeout) && parent.Err() == nil && !errors.Is(ge.Err, ErrTimeout) {
			ge.Err = fmt.Errorf("%w after %v: %w", ErrTimeout, g.timeout, ge.Err)
		}
	}
	if err != nil {
		return 0, err
	}
	if !(s >= 0 && s <= 1) {
		return 0, &Error{TaskID: taskID, Metric: m.Func, Index: index, Op: "metric", Err: fmt.Errorf("score %v outside [0, 1]", s)}
	}
	g.log.Debug("grade: metric", "task", taskID, "metric", m.Func, "index", index,
		"runner", where.String(), "score", s, "took", time.Since(began))
	return s, nil
}

// roleGetter is a getter with its role in the metric call.
type roleGetter struct {
	role string // "result" or "expected"
	Getter
}

func (r roleGetter) op() string { return r.role + " getter " + r.Type }

func (m Metric) getters() []roleGetter {
	out := []roleGetter{{"result", m.Result}}
	if m.Expected != nil {
		out = append(out, roleGetter{"expected", *m.Expected})
	}
	return out
}

func getterConfig(gt Getter) (*pyDict, error) {
	v, err := decodePy(gt.Config)
	if err != nil {
		return nil, fmt.Errorf("getter config: %w", err)
	}
	d, ok := v.(*pyDict)
	if !ok {
		return nil, fmt.Errorf("getter config is a %s, not an object", pyTypeName(v))
	}
	return d, nil
}

func (g *Grader) nativeMetric(ctx context.Context, env *nativeEnv, m Metric, in *inputs) (float64, error) {
	values := make([]any, 0, 2)
	for _, gt := range m.getters() {
		get, _ := nativeGetterFor(gt.Type)
		cfg, err := getterConfig(gt.Getter)
		if err != nil {
			return 0, &Error{Op: gt.op(), Err: err}
		}
		v, err := get(ctx, env, cfg)
		if err != nil {
			err = &Error{Op: gt.op(), Err: err}
			if gt.role == "result" && errors.Is(err, ErrNoFile) {
				return 0, &noResultFile{err}
			}
			return 0, err
		}
		values = append(values, v)
	}
	// Before the metric, which may open what the getters fetched.
	in.shown = inputText(values[0], env.cacheDir)
	in.result = textDigest(in.shown)
	if len(values) == 2 {
		in.expected = inputDigest(values[1], env.cacheDir)
	}
	opts, err := decodePy(m.Options)
	if err != nil {
		return 0, &Error{Op: "metric", Err: fmt.Errorf("options: %w", err)}
	}
	metric, ok := g.extraMetrics[m.Func]
	if !ok {
		metric, _ = nativeMetricFor(m.Func)
	}
	var expected any
	if len(values) == 2 {
		expected = values[1]
	}
	s, err := metric.call(m.Func, values[0], expected, len(values) == 2, opts.(*pyDict))
	if err != nil {
		return 0, &Error{Op: "metric", Err: err}
	}
	return s, nil
}

// bridgeMetric runs the metric in the bridge. The bridge enforces the
// timeout itself, by killing the process.
func (g *Grader) bridgeMetric(ctx context.Context, timeout time.Duration, m Metric, cacheDir string, in *inputs) (float64, error) {
	req := &bridgeRequest{
		Op:       "grade",
		Metric:   m.Func,
		Result:   m.Result.Config,
		Options:  m.Options,
		CacheDir: cacheDir,
		Env: &bridgeEnv{
			Host:         cmp.Or(g.cfg.Env.Host, DefaultHost),
			ServerPort:   g.cfg.Env.ServerPort,
			ChromiumPort: g.cfg.Env.ChromiumPort,
			VLCPort:      g.cfg.Env.VLCPort,
			Platform:     g.cfg.Env.Platform,
		},
	}
	if m.Expected != nil {
		req.Expected = m.Expected.Config
	}
	ans, err := g.pool.do(ctx, req, timeout)
	if err != nil {
		return 0, &Error{Op: "bridge", Err: err}
	}
	if ans.Score != nil {
		*in = inputs{result: ans.Inputs.Result, expected: ans.Inputs.Expected, shown: ans.Shown}
		return *ans.Score, nil
	}
	op := "metric"
	switch ans.Where {
	case "result getter":
		op = "result getter " + m.Result.Type
	case "expected getter":
		if m.Expected != nil {
			op = "expected getter " + m.Expected.Type
		}
	}
	err = &Error{Op: op, Err: errAnswer(ans)}
	if ans.Kind == "file_not_found" {
		return 0, &noResultFile{err}
	}
	return 0, err
}

// emptyDir makes dir an empty directory. It removes what is in it rather
// than the directory itself: most grades leave nothing, and removing a
// directory is slow on some file systems.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// safeName turns a task id into one directory name.
func safeName(id string) string {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`) {
		sum := sha256.Sum256([]byte(id))
		return "task-" + hex.EncodeToString(sum[:8])
	}
	return id
}
