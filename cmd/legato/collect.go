package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

//go:embed demo_tasks.json
var demoTasks []byte

// collectFlags are the flags of `legato rl collect`, bound straight into the
// library's option structs.
type collectFlags struct {
	tasks, out, backend       string
	ow                        osworldFlags
	pol                       rl.PolicyConfig
	opts                      rl.CollectOptions
	noReadySignal, noRetryErr bool
	fixed                     desktop.FixedWaits
	retries                   int
	policyURLs                stringList
	sampling                  struct{ temperature, topP optFloat }
	harness, systemPrompt     string
	eviction                  qwen.Eviction
	fake                      fakeFlags
	verbose                   bool
	history                   string
	// contiguous is the harness of the same family and system prompt
	// that evicts no screenshot, for a service's contiguous groups.
	contiguous policy.Harness
	// noPolicy: the command makes no model call (a replay), so setup
	// starts no model server.
	noPolicy bool
	// set is the flag set the command parsed into f: which flags it was
	// given (checkBackendFlags).
	set *flag.FlagSet
	// endStatesIn is the run directory whose kept end states the fake
	// desktops grade (a regrade).
	endStatesIn string
}

type fakeFlags struct {
	seed    uint64
	success float64
	speed   string
	flaky   stringList
	// solved are the tasks whose untouched start state scores 1.
	solved stringList
}

func newCollectFlags(stderr io.Writer) (*flag.FlagSet, *collectFlags) {
	f := &collectFlags{}
	const day, week = 24 * time.Hour, 7 * 24 * time.Hour
	fs := newFlagSet("legato rl collect", stderr)
	fs.StringVar(&f.tasks, "tasks", "", "tasks file: [{\"task_id\",\"domain\"}], [{\"task_id\",\"config\"}] or an OSWorld index (default with --backend fake: built-in demo tasks)")
	fs.Var(&f.policyURLs, "policy-url", "model server's OpenAI API root, e.g. http://127.0.0.1:8000/v1 (default: a built-in scripted server on loopback); repeat it for replicas of the same weights: a group's calls go to one replica while it answers")
	fs.StringVar(&f.pol.Model, "model", "", "model name sent to the server (default with the built-in server: scripted)")
	fs.StringVar(&f.pol.Version, "version", "", "policy version recorded with every rollout, e.g. step-41 (default with the built-in server: demo)")
	fs.StringVar(&f.out, "out", "", "run directory (required); collecting into it again continues the batch, with the same tasks, policy, backend and knobs (batch.json)")
	intVar(fs, &f.opts.Desktops, "desktops", 4, 1, rl.MaxDesktops, "desktops, one worker each")
	intVar(fs, &f.opts.Group, "group", rl.DefaultGroup, 1, rl.MaxGroup, "attempts per task that close its GRPO group")
	fs.Float64Var(&f.opts.Oversample, "oversample", 0, "extra attempts per group, as a fraction of --group; the slowest are cancelled")
	intVar(fs, &f.opts.MaxSteps, "max-steps", rl.DefaultMaxSteps, 1, rl.MaxMaxSteps, "model calls per attempt")
	intVar(fs, &f.pol.MaxInflight, "max-inflight", 0, 0, math.MaxInt32, "cap on concurrent model requests per replica (0: none)")
	durationVar(fs, &f.pol.StepTimeout, "step-timeout", policy.DefaultStepTimeout, time.Millisecond, day, "bound on one model call attempt")
	intVar(fs, &f.retries, "retries", policy.DefaultRetries, 0, 100, "extra tries of a model call after a timeout, connection error, 429 or 5xx")
	durationVar(fs, &f.opts.RolloutTimeout, "rollout-timeout", 0, 0, week, "wall-clock cap on an attempt's stepping; it is then graded and marked truncated (0: none; otherwise at least 1s)")
	intVar(fs, &f.opts.EnvRetries, "env-retries", rl.DefaultEnvRetries, 0, 100, "times an attempt is re-queued after its desktop failed")
	durationVar(fs, &f.opts.ServerDownTimeout, "server-down-timeout", rl.DefaultServerDownTimeout, time.Second, week, "how long desktops wait for a model server that stopped answering before the batch stops (resume it later)")
	fs.BoolVar(&f.noRetryErr, "no-retry-errors", false, "when continuing a batch, do not rerun attempts whose record is an error")
	fs.BoolVar(&f.noReadySignal, "no-ready-signal", false, "fixed sleeps (--fixed-wait*) instead of waiting for the screen to settle, for baselines; each wait is only what its flag says")
	durationVar(fs, &f.fixed.AfterAction, "fixed-wait", 0, 0, day, "with --no-ready-signal: sleep after each action")
	durationVar(fs, &f.fixed.AfterReset, "fixed-wait-after-reset", 0, 0, day, "with --no-ready-signal: sleep after a reset (OSWorld's runner slept 60)")
	durationVar(fs, &f.fixed.BeforeEval, "fixed-wait-before-eval", 0, 0, day, "with --no-ready-signal: sleep before grading (OSWorld's runner slept 20)")
	intVar(fs, &f.opts.ImageMax, "image-max", rl.DefaultImageMax, 1, rl.MaxImageMax, "screenshots kept in the prompt")
	choiceVar(fs, &f.history, "history", "per-step", []string{"per-step", "contiguous"}, "prompt history: per-step (screenshots past --image-max leave the prompt) or contiguous (none ever leaves: each prompt extends the last token for token, so an attempt exports as one sequence with a loss mask, export --contiguous)")
	fs.TextVar(&f.eviction, "eviction", qwen.EvictHalf, "how screenshots leave the prompt past --image-max: half (the oldest half at once, keeping the prefix cache) or oldest (one a step)")
	fs.StringVar(&f.harness, "harness", qwen.Qwen3VL.String(), "the model family's prompt and action conventions: "+strings.Join(qwen.Families(), " or "))
	fs.StringVar(&f.systemPrompt, "system-prompt", "", "a file holding the system prompt to send instead of the built-in one (the prompt your model was trained with)")
	fs.Var(&f.sampling.temperature, "temperature", "sampling temperature sent with every request (default: the server's)")
	fs.Var(&f.sampling.topP, "top-p", "nucleus sampling top-p sent with every request (default: the server's)")
	intVar(fs, &f.pol.MaxTokens, "max-tokens", 0, 0, 1<<24, "cap on generated tokens per model call (0: the server's default)")
	f.ow.Register(fs)
	advantageStdVar(fs, &f.opts.AdvantageStd, "the `std` dividing a group's advantages, (reward - mean) / std, as OnGroup and the service give them and export writes them (batch.json records it; continuing a batch keeps its own and refuses another; default for a new batch: population, divide by n); sample divides by n-1, as slime and SkyRL do (advantages 1.155 times smaller at G=4)")
	fs.Var(&fraction{p: &f.opts.GradeTwice, bare: 1}, "grade-twice", "grade this fraction of end states a second time (getters and metric, no postconfig), 0 to 1 (bare: every one); a task whose grader gives another reward is quarantined")
	fs.StringVar(&f.opts.Quarantine, "quarantine", "", "task quarantine file shared across batches: tasks it holds are skipped (named in the summary); tasks this batch finds unfit go into it and into the run's quarantine.json")
	fs.BoolVar(&f.opts.KeepEndStates, "keep-end-states", false, "keep every attempt's end state before its grade, so legato rl regrade can grade it again later, in DIR/end-states (osworld backend: root and VMs on this machine; the guest RAM and disk changes, tens of MB per attempt)")
	fs.Var(byteSize64{&f.opts.EndStateBytes}, "end-states-max", "bound on the space of kept end states; the oldest are dropped past it (`size`: bytes, or with KiB, MiB, GiB; default 100GiB)")
	intVar(fs, &f.opts.QuarantineSetupFails, "quarantine-setup-fails", rl.DefaultQuarantineSetupFails, 1, 1000, "desktops a task's reset must fail on before it is quarantined (and on more than half of its resets)")
	fs.StringVar(&f.backend, "backend", "fake", "desktops: fake (no VMs) or osworld (libvirt VMs)")
	fs.Uint64Var(&f.fake.seed, "fake-seed", 1, "fake backend: seed of every random draw")
	fs.Float64Var(&f.fake.success, "fake-success", 0.5, "fake backend: probability that an attempt of a feasible task scores 1")
	fs.Var(&f.fake.flaky, "fake-flaky", "fake backend: a task `id` whose grader disagrees with itself (a second grade draws again); repeat it for several")
	fs.Var(&f.fake.solved, "fake-solved-at-start", "fake backend: a task `id` whose untouched start state already scores 1, as when the image's defaults pass it (legato rl tasks check finds it); repeat it for several")
	fs.StringVar(&f.fake.speed, "fake-speed", "demo", "fake backend latencies: none, demo (fractions of a second) or real (VM-like seconds)")
	fs.BoolVar(&f.verbose, "v", false, "log every retry and desktop failure")
	f.set = fs
	setUsage(fs, `Usage: legato rl collect --out DIR [flags]

Runs a batch: every task's group of attempts on a pool of desktops, each
attempt graded by the task's evaluator, written to DIR in the
legato.rollout/v0 format. With no --policy-url and the fake backend it runs
end to end on this machine: no VM, no GPU. The model server's key is read
from LEGATO_POLICY_KEY. A flag of the other backend (--golden-fork with
--backend fake, --fake-seed with osworld) is refused.

`)
	return fs, f
}

// desktopFlags are the collect flags of a command that runs tasks on
// desktops without a model: what makes its desktops and screens the
// batch's (the backend, the tasks, the harness, the waits).
var desktopFlags = []string{"tasks", "desktops", "backend", "fake-seed", "fake-success", "fake-speed", "fake-flaky",
	"fake-solved-at-start", "harness", "system-prompt", "image-max", "eviction", "history", "no-ready-signal",
	"fixed-wait", "fixed-wait-after-reset", "fixed-wait-before-eval", "quarantine", "v"}

// newDesktopFlags returns the flag set of such a command: every osworld
// backend flag and those of desktopFlags, as collect has them and bound
// to the returned collectFlags, which start no model server.
func newDesktopFlags(name string, stderr io.Writer) (*flag.FlagSet, *collectFlags) {
	cfs, f := newCollectFlags(stderr)
	f.noPolicy = true
	fs := newFlagSet(name, stderr)
	owOnly := flag.NewFlagSet("", flag.ContinueOnError)
	f.ow.Register(owOnly)
	take := map[string]bool{}
	for _, name := range desktopFlags {
		take[name] = true
	}
	owOnly.VisitAll(func(fl *flag.Flag) { take[fl.Name] = true })
	cfs.VisitAll(func(fl *flag.Flag) {
		if take[fl.Name] {
			fs.Var(fl.Value, fl.Name, fl.Usage)
		}
	})
	f.set = fs
	return fs, f
}

// fakeOnlyFlags are the flags of the fake backend. --fake-speed also sets
// the latency of the built-in model server.
var fakeOnlyFlags = []string{"fake-seed", "fake-success", "fake-flaky", "fake-solved-at-start", "fake-speed"}

// sharedOSWorldFlags are osworld flags that mean something with any
// backend: --osworld resolves the tasks a tasks file names by reference.
var sharedOSWorldFlags = []string{"osworld"}

// flagBackend returns the backend a flag belongs to, "fake" or "osworld",
// or "" for a flag of every backend.
func flagBackend(name string) string {
	if slices.Contains(fakeOnlyFlags, name) {
		return "fake"
	}
	if slices.Contains(sharedOSWorldFlags, name) {
		return ""
	}
	if osworldFlagNames[name] {
		return "osworld"
	}
	return ""
}

// osworldFlagNames are the flags osworldFlags.Register defines.
var osworldFlagNames = func() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	new(osworldFlags).Register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(fl *flag.Flag) { names[fl.Name] = true })
	return names
}()

// checkBackendFlags refuses the flags given (names, without dashes) that
// belong to another backend than backend: accepted, they would be
// ignored. builtinServer says the built-in model server runs, whose
// latency --fake-speed sets with any backend. An unknown backend is left
// to setup to refuse.
func checkBackendFlags(backend string, given []string, builtinServer bool) error {
	if backend != "fake" && backend != "osworld" {
		return nil
	}
	var errs []string
	for _, name := range given {
		owner := flagBackend(name)
		if owner == "" || owner == backend || name == "fake-speed" && builtinServer {
			continue
		}
		what := ""
		if name == "fake-speed" {
			what = " (and of the built-in model server, which does not run with --policy-url or without a model)"
		}
		errs = append(errs, fmt.Sprintf("--%s is a flag of the %s backend%s and --backend is %s: drop it, or use --backend %s",
			name, owner, what, backend, owner))
	}
	if len(errs) > 0 {
		return usageErrorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// runCollect is `legato rl collect`.
func runCollect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// The log, the progress line and the libraries' warnings write to
	// stderr from several goroutines.
	out := stderr
	stderr = &lockedWriter{w: stderr}
	fs, f := newCollectFlags(stderr)
	if err := f.parse(fs, args); err != nil {
		return err
	}
	log := f.logger(stderr)
	cleanup, tasks, err := f.setup(ctx, log, stderr, true)
	defer cleanup()
	if err != nil {
		return err
	}

	fmt.Fprintf(stderr, "collecting %d tasks × %d attempts on %d %s desktops into %s (policy %s %s)\n",
		len(tasks), rl.AttemptsPerTask(f.opts.Group, f.opts.Oversample), f.opts.Desktops, f.backend, f.out, f.pol.Model, f.pol.Version)
	pr := newProgressPrinter(stderr, out)
	f.opts.Progress = pr.print
	sum, err := rl.Collect(ctx, tasks, f.pol, f.opts)
	pr.done()
	if sum != nil {
		writeCollectSummary(stdout, stderr, f.out, sum, err)
	}
	if errors.Is(err, rl.ErrInvalidOptions) {
		return usage(err)
	}
	return err
}

// parse parses args into f, refusing arguments that are not flags, a
// missing --out and values that cannot run (validate).
func (f *collectFlags) parse(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q; all options are flags", fs.Args())
	}
	if f.out == "" {
		return usageErrorf("--out DIR is required")
	}
	return f.validate(fs)
}

// logger is the log of a run: warnings, or everything with -v.
func (f *collectFlags) logger(stderr io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// setup turns the flags into the policy and options of a run: the harness,
// the desktops of the backend, the built-in model server when no
// --policy-url is given, and the tasks (loaded when needTasks or --tasks is
// given). cleanup closes what it started, in reverse order; call it even on
// error.
func (f *collectFlags) setup(ctx context.Context, log *slog.Logger, stderr io.Writer, needTasks bool) (cleanup func(), _ []rl.Task, err error) {
	var closers []func()
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	var given []string
	f.set.Visit(func(fl *flag.Flag) { given = append(given, fl.Name) })
	if err := checkBackendFlags(f.backend, given, !f.noPolicy && len(f.policyURLs) == 0); err != nil {
		return cleanup, nil, err
	}
	f.pol.APIKey = os.Getenv(policy.KeyEnv)
	f.pol.Retries = f.retries
	f.pol.Logger = log
	f.opts.Out = f.out
	f.opts.Logger = log
	if f.opts.EnvRetries == 0 {
		f.opts.EnvRetries = -1 // the flag's 0 means none; the library's zero means the default
	}
	if f.noRetryErr {
		f.opts.ErrorReruns = -1
	}
	if f.history == "contiguous" {
		// Every screenshot stays: the prompt only ever grows.
		f.opts.ImageMax = rl.MaxImageMax
	}
	hcfg := qwen.Config{ImageMax: f.opts.ImageMax, Eviction: f.eviction}
	if f.systemPrompt != "" {
		text, err := os.ReadFile(f.systemPrompt)
		if err != nil {
			return cleanup, nil, usageErrorf("--system-prompt: %v", err)
		}
		hcfg.SystemPrompt = string(text)
	}
	h, err := qwen.NewFamily(f.harness, hcfg)
	if err != nil {
		return cleanup, nil, usageErrorf("--harness %s --system-prompt %q: %v", f.harness, f.systemPrompt, err)
	}
	f.opts.Harness = h
	whole := hcfg
	whole.ImageMax = rl.MaxImageMax
	if f.contiguous, err = qwen.NewFamily(f.harness, whole); err != nil {
		return cleanup, nil, usageErrorf("--harness %s: %v", f.harness, err)
	}
	f.pol.Temperature, f.pol.TopP = f.sampling.temperature.v, f.sampling.topP.v

	// checkTasks refuses, before anything runs, tasks the backend could
	// not set up or grade.
	checkTasks := func([]rl.Task) error { return nil }
	switch f.backend {
	case "fake":
		cfg, err := f.fake.config()
		if err != nil {
			return cleanup, nil, err
		}
		if f.opts.KeepEndStates || f.endStatesIn != "" {
			cfg.EndStates = filepath.Join(f.out, schema.EndStatesDir)
			if f.endStatesIn != "" {
				cfg.EndStates = filepath.Join(f.endStatesIn, schema.EndStatesDir)
			}
		}
		f.opts.NewDesktop = fake.NewFleet(cfg).New
		f.opts.Environment = fakeEnvironment(f.fake)
	case "osworld":
		if f.opts.KeepEndStates || f.endStatesIn != "" {
			if len(f.ow.cfg.Guests) > 0 {
				return cleanup, nil, usageErrorf("kept end states: guests given by --guest-url cannot keep or bring back end states (a kept state is a VM's RAM and disk): run VMs (--image)")
			}
			if os.Geteuid() != 0 {
				return cleanup, nil, usageErrorf("kept end states: the osworld backend keeps and brings back end states as root only (it reads libvirt's QEMU command line and runs the clones that bring states back): run legato as root")
			}
			f.ow.cfg.EndStates = filepath.Join(f.out, schema.EndStatesDir)
			if f.endStatesIn != "" {
				f.ow.cfg.EndStates = filepath.Join(f.endStatesIn, schema.EndStatesDir)
			}
		}
		pool, err := f.ow.Pool(ctx, log)
		if err != nil {
			return cleanup, nil, err
		}
		closers = append(closers, func() {
			if err := pool.Close(); err != nil {
				log.Warn("close desktops", "err", err)
			}
		})
		if n := pool.Config().Slots(); n > 0 && f.opts.Desktops > n {
			what := "--guest-url given"
			if len(pool.Config().Guests) == 0 {
				what = "desktop slots on the --host hosts (desktops=N)"
			}
			fmt.Fprintf(stderr, "--desktops %d: only %d %s; using %d desktops\n", f.opts.Desktops, n, what, n)
			f.opts.Desktops = n
		}
		f.opts.NewDesktop = pool.New
		f.opts.Environment = osworldEnvironment(pool.Config(), pool.ImageFiles())
		checkTasks = pool.CheckTasks
	default:
		return cleanup, nil, usageErrorf("--backend %q: want fake or osworld", f.backend)
	}
	if f.noReadySignal {
		f.opts.NewDesktop = desktop.WithFixedWaits(f.opts.NewDesktop, f.fixed)
	}
	var tasks []rl.Task
	if needTasks || f.tasks != "" {
		if tasks, err = loadCollectTasks(f); err != nil {
			return cleanup, nil, err
		}
		if err := checkTasks(tasks); err != nil {
			return cleanup, nil, err
		}
		if err := knownTasks("--fake-flaky", f.fake.flaky, tasks); err != nil {
			return cleanup, nil, err
		}
		if err := knownTasks("--fake-solved-at-start", f.fake.solved, tasks); err != nil {
			return cleanup, nil, err
		}
	}

	if f.noPolicy {
		return cleanup, tasks, nil
	}
	if len(f.policyURLs) > 0 {
		f.pol.BaseURL, f.pol.Replicas = f.policyURLs[0], f.policyURLs[1:]
	}
	if f.pol.BaseURL == "" {
		srv, err := startBuiltinServer(f, stderr)
		if err != nil {
			return cleanup, nil, err
		}
		closers = append(closers, srv.Close)
	} else if f.pol.Model == "" || f.pol.Version == "" {
		return cleanup, nil, usageErrorf("--model and --version are required with --policy-url")
	}

	return cleanup, tasks, nil
}

// validate refuses flag values that cannot run a batch before anything
// starts. The library takes zero as "the default"; on the command line a
// value given is a value meant, so zero is refused where it cannot work.
func (f *collectFlags) validate(fs *flag.FlagSet) error {
	var errs []string
	if t := f.sampling.temperature.v; t != nil && (*t < 0 || *t > 2) {
		errs = append(errs, fmt.Sprintf("--temperature %v: want 0 to 2", *t))
	}
	if p := f.sampling.topP.v; p != nil && (*p <= 0 || *p > 1) {
		errs = append(errs, fmt.Sprintf("--top-p %v: want more than 0, at most 1", *p))
	}
	if p := f.fake.success; !(p >= 0 && p <= 1) { // NaN too
		errs = append(errs, fmt.Sprintf("--fake-success %v: want a probability from 0 to 1", p))
	}
	if !f.noReadySignal {
		fs.Visit(func(fl *flag.Flag) {
			if strings.HasPrefix(fl.Name, "fixed-wait") {
				errs = append(errs, fmt.Sprintf("--%s applies only with --no-ready-signal", fl.Name))
			}
		})
	}
	if f.history == "contiguous" {
		fs.Visit(func(fl *flag.Flag) {
			if fl.Name == "image-max" || fl.Name == "eviction" {
				errs = append(errs, fmt.Sprintf("--%s does not go with --history contiguous, which keeps every screenshot", fl.Name))
			}
		})
	}
	if len(errs) > 0 {
		return usageErrorf("%s", strings.Join(errs, "\n"))
	}
	// The library checks the rest (--oversample, ...).
	o := f.opts
	o.Out, o.NewDesktop = f.out, func(context.Context, int) (desktop.Desktop, error) { return nil, nil }
	if err := o.Validate(); err != nil {
		return usage(err)
	}
	return nil
}

func loadCollectTasks(f *collectFlags) ([]rl.Task, error) {
	opts := rl.LoadOptions{OSWorldDir: f.ow.cfg.Grade.OSWorldDir}
	if f.tasks == "" {
		if f.backend != "fake" {
			return nil, usageErrorf("--tasks FILE is required with --backend %s", f.backend)
		}
		return rl.ParseTasks(demoTasks, "built-in demo tasks", opts)
	}
	return rl.LoadTasks(f.tasks, opts)
}

// startBuiltinServer serves the scripted model on a loopback port and points
// the policy at it, so that a batch runs with no GPU.
func startBuiltinServer(f *collectFlags, stderr io.Writer) (*policytest.Server, error) {
	if f.pol.Model == "" {
		f.pol.Model = "scripted"
	}
	if f.pol.Version == "" {
		f.pol.Version = "demo"
	}
	lat := policytest.DefaultLatency()
	if f.fake.speed == "none" {
		lat = policytest.Latency{}
	}
	// Two workers per CPU: the server shares this process with the
	// batch, which a real one does not (policytest.Options.Workers).
	srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: f.pol.Model, Latency: lat, NoLatency: f.fake.speed == "none", Workers: 2 * runtime.GOMAXPROCS(0)})
	if err != nil {
		return nil, fmt.Errorf("start the built-in model server: %w", err)
	}
	f.pol.BaseURL = srv.URL()
	fmt.Fprintf(stderr, "policy: the built-in scripted model server at %s (vLLM dialect)\n", srv.URL())
	return srv, nil
}

func (ff fakeFlags) config() (fake.Config, error) {
	cfg := fake.Config{Seed: ff.seed, DefaultReward: fake.Reward{P: ff.success}}
	for _, id := range slices.Concat(ff.flaky, ff.solved) {
		if cfg.Rewards == nil {
			cfg.Rewards = map[string]fake.Reward{}
		}
		r := fake.Reward{P: ff.success, Flaky: slices.Contains(ff.flaky, id)}
		if slices.Contains(ff.solved, id) {
			r.AtStart = 1
		}
		cfg.Rewards[id] = r
	}
	ms := func(n int) fake.Latency { return fake.Latency{Fixed: time.Duration(n) * time.Millisecond} }
	switch ff.speed {
	case "none":
	case "demo":
		cfg.Latency = fake.Latencies{
			Create: ms(200), Reset: ms(300), WaitAfterReset: ms(100), Observe: ms(20),
			Act: ms(50), Settle: ms(150), WaitBeforeEval: ms(50), Evaluate: ms(100),
		}
	case "real":
		cfg.Latency = fake.Latencies{
			Create: ms(8000), Reset: ms(2000), WaitAfterReset: ms(1000), Observe: ms(400),
			Act: ms(300), Settle: ms(1000), WaitBeforeEval: ms(500), Evaluate: ms(1500),
		}
	default:
		return cfg, usageErrorf("--fake-speed %q: want none, demo or real", ff.speed)
	}
	return cfg, usage(cfg.Validate())
}

// writeCollectSummary writes the batch's summary s and what to do next;
// err is what Collect returned with it.
func writeCollectSummary(w, stderr io.Writer, dir string, s *rl.Summary, err error) {
	var parts []string
	for _, st := range []rl.Status{rl.StatusOK, rl.StatusTruncated, rl.StatusCancelled, rl.StatusSkipped, rl.StatusSurplus, rl.StatusRetried, rl.StatusError} {
		if n := s.Counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", st, n))
		}
	}
	fmt.Fprintf(w, "%s: %s; %d/%d groups closed; %s\n", dir, s.State, s.GroupsClosed, s.Groups, strings.Join(parts, ", "))
	hit := "unknown (the server did not report cached tokens)"
	if s.PrefixCacheReported {
		hit = fmt.Sprintf("%.2f", s.PrefixCacheHitRate)
	}
	fmt.Fprintf(w, "success rate %.3f, %.0f rollouts/hour, %d groups with reward variance, prefix-cache hit rate %s\n",
		s.SuccessRate, s.RolloutsPerHour, s.GroupsWithVariance, hit)
	if s.GradedTwice > 0 {
		n := 0
		for _, c := range s.GraderDisagreements {
			n += c
		}
		fmt.Fprintf(w, "graded %d end states twice; the grader gave another reward on %d\n", s.GradedTwice, n)
	}
	for _, id := range slices.Sorted(maps.Keys(s.Quarantined)) {
		fmt.Fprintf(w, "quarantined %s (%s): see %s\n", id, s.Quarantined[id], filepath.Join(dir, schema.TaskQuarantineFile))
	}
	if s.ServerDownS > 0 || s.ErrorsRerun > 0 {
		fmt.Fprintf(w, "model server down %.0f s in all; %d error records rerun\n", s.ServerDownS, s.ErrorsRerun)
	}
	for _, warn := range s.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", warn)
	}
	switch s.State {
	case rl.StateComplete:
		fmt.Fprintf(w, "next: legato rl export %s --out %s/train.jsonl; legato rl profile %s\n", dir, dir, dir)
	case rl.StateIncomplete:
		var inc *rl.IncompleteError
		if errors.As(err, &inc) && inc.Rerunnable > 0 {
			fmt.Fprintf(w, "next: collect again to rerun %d error records, or export what closed: legato rl export %s --out %s/train.jsonl\n", inc.Rerunnable, dir, dir)
			break
		}
		fmt.Fprintf(w, "next: export what closed: legato rl export %s --out %s/train.jsonl (the error records have used up their reruns: fix their cause and collect into a new directory)\n", dir, dir)
	}
}

// progressPrinter shows a batch's progress: one line rewritten in place on
// a terminal, a plain line every 10 s otherwise (logs, CI).
type progressPrinter struct {
	w     io.Writer
	tty   bool
	last  time.Time
	drawn bool
}

// newProgressPrinter prints to w; dest is what w writes to in the end, a
// terminal or not.
func newProgressPrinter(w, dest io.Writer) *progressPrinter {
	p := &progressPrinter{w: w}
	if f, ok := dest.(*os.File); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	return p
}

func (p *progressPrinter) print(pr rl.Progress) {
	if !p.tty && !pr.Final && time.Since(p.last) < 10*time.Second {
		return
	}
	p.last = time.Now()
	line := progressLine(pr)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.drawn = true
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progressPrinter) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

func progressLine(pr rl.Progress) string {
	var parts []string
	for _, st := range []rl.Status{rl.StatusOK, rl.StatusTruncated, rl.StatusCancelled, rl.StatusSkipped, rl.StatusSurplus, rl.StatusRetried, rl.StatusError} {
		if n := pr.Counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", st, n))
		}
	}
	eta := "?"
	if pr.ETA > 0 {
		eta = pr.ETA.Round(time.Second).String()
	}
	return fmt.Sprintf("[%s] groups %d/%d | %s | %.0f rollouts/h | running %d, model calls in flight %d | ETA %s",
		pr.Elapsed.Round(time.Second), pr.GroupsEnded, pr.GroupsTotal, strings.Join(parts, ", "),
		pr.RolloutsPerHour, pr.Running, pr.InFlight, eta)
}

// optFloat is a float flag that tells "not given" (nil: the server's
// default) from any value, 0 included.
type optFloat struct{ v *float64 }

func (o *optFloat) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.FormatFloat(*o.v, 'g', -1, 64)
}

func (o *optFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%q: want a number", s)
	}
	o.v = &v
	return nil
}

// byteSize64 is a size flag: bytes, or a number with KiB, MiB or GiB.
type byteSize64 struct{ p *int64 }

func (b byteSize64) String() string {
	if b.p == nil || *b.p == 0 {
		return ""
	}
	return strconv.FormatInt(*b.p, 10)
}

func (b byteSize64) Set(s string) error {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("want a size above 0: bytes, or a number with KiB, MiB or GiB")
	}
	*b.p = n * mult
	return nil
}

// knownTasks refuses task ids a flag names that the batch does not have.
func knownTasks(flagName string, ids []string, tasks []rl.Task) error {
	have := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		have[t.ID] = true
	}
	for _, id := range ids {
		if !have[id] {
			return usageErrorf("%s %q: no such task in the batch (see --tasks)", flagName, id)
		}
	}
	return nil
}

// fraction is a flag holding a number from 0 to 1 that may be given bare
// (--grade-twice), meaning the value bare.
type fraction struct {
	p    *float64
	bare float64
}

func (f *fraction) String() string {
	if f == nil || f.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.p, 'g', -1, 64)
}

func (f *fraction) Set(s string) error {
	if s == "true" {
		*f.p = f.bare
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= 0 && v <= 1) {
		return fmt.Errorf("%q: want a fraction from 0 to 1", s)
	}
	*f.p = v
	return nil
}

// IsBoolFlag lets the flag stand bare.
func (f *fraction) IsBoolFlag() bool { return true }

// stringList is a flag that may be repeated.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// lockedWriter serializes writes to w, which need not be safe for
// concurrent use (a test's buffer).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
