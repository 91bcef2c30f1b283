package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rl "legato/rl"
	"legato/rl/desktop/fake"
	"legato/rl/export"
	"legato/rl/internal/benchrun"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// benchCommand is `legato rl bench`: the export's speed beside copying the
// same bytes, and how long finished attempts wait for their records'
// commit, measured on this machine.
type benchCommand struct {
	run      benchrun.Run
	dir      string
	only     string
	desktops int
	attempts int
	workers  optInt
	process  bool
}

// benchShapes are the export shapes bench measures, by their names in
// --only and in its table.
var benchShapes = []struct {
	name  string
	opts  export.Options
	flags []string // the same for legato rl export
}{
	{"steps", export.Options{}, nil},
	{"prefix", export.Options{PromptPrefix: true}, []string{"--prompt-prefix"}},
	{"contiguous", export.Options{Contiguous: true}, []string{"--contiguous"}},
}

func (c *benchCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl bench", stderr)
	fs.IntVar(&c.run.Rollouts, "rollouts", 2000, "export: rollouts in the synthetic run")
	fs.IntVar(&c.run.Steps, "steps", 15, "export: steps per rollout (each prompt 2,000 token ids + 300 a step)")
	fs.IntVar(&c.run.Group, "group", 8, "export: attempts per task")
	fs.StringVar(&c.dir, "dir", "", "export: keep the synthetic run in `DIR` and reuse it next time (default: a temporary directory, removed)")
	fs.StringVar(&c.only, "only", "", "measure only `WHAT`: export, commit, or one export shape (steps, prefix, contiguous)")
	fs.BoolVar(&c.process, "process", false, "export: run each export as `legato rl export` in a process of its own, as a trainer does (its start and its memory's first use included), instead of in this one")
	fs.IntVar(&c.desktops, "desktops", 1000, "commit: instant fake desktops")
	fs.IntVar(&c.attempts, "attempts", 1000, "commit: attempts in the batch (groups of 4, at most 5 steps each)")
	fs.Var(&c.workers, "server-workers", "commit: the scripted server works on `n` requests at once, 0 for no bound (default: two per CPU)")
	setUsage(fs, `Usage: legato rl bench [flags]

Measures this machine's export and commit speed, without a model or a VM.

Export: writes a synthetic run (stored as collect stores one, prompt token ids
included), exports it in each shape and prints MB/s, rollouts/s and CPU
seconds beside the time reading and writing the same bytes takes (a cat to a
synced file): x-cat is the export's time over that. io-s adds the time to read
what the export reads (records, messages, token ids): x-io is the export's
time over that, the disk's bound for a shape that writes less than it reads.
The exports run in this process one after the other, each on the memory the
one before used; --process runs each as the legato rl export a trainer runs.

Commit: runs a batch on instant fake desktops with a scripted model server in
the process and prints how long finished attempts waited for their records
to be durable (p50, p90, p99, max), and graded rollouts per second. A real
server runs on a machine of its own: --server-workers keeps this one from
taking the batch's CPU with a thousand requests at once.

`)
	return fs
}

func (c *benchCommand) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"--rollouts", c.run.Rollouts}, {"--steps", c.run.Steps}, {"--group", c.run.Group}, {"--desktops", c.desktops}, {"--attempts", c.attempts}} {
		if f.v <= 0 {
			return usageErrorf("%s %d: want a positive number", f.name, f.v)
		}
	}
	switch c.only {
	case "", "export", "commit":
		return nil
	}
	for _, s := range benchShapes {
		if s.name == c.only {
			return nil
		}
	}
	return usageErrorf("--only %q: want one of %s", c.only, benchOnlyNames())
}

// Run parses args and prints each measurement as it is made.
func (c *benchCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q", fs.Args())
	}
	if err := c.check(); err != nil {
		return err
	}
	c.run.PromptIDs = true
	if c.only != "commit" {
		if err := c.benchExport(ctx, stdout); err != nil {
			return fmt.Errorf("export: %w", err)
		}
	}
	if c.only == "" || c.only == "commit" {
		if err := c.benchCommit(ctx, stdout); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	return nil
}

func (c *benchCommand) benchExport(ctx context.Context, stdout io.Writer) error {
	tmp, err := os.MkdirTemp("", "legato-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := c.dir
	if dir == "" {
		dir = filepath.Join(tmp, "run")
	}
	t0, cpu0 := time.Now(), benchrun.CPUTime()
	wrote, err := benchrun.Generate(dir, c.run)
	if err != nil {
		return err
	}
	how := fmt.Sprintf("reused %s", dir)
	if wrote {
		how = fmt.Sprintf("generated in %.1f s (%.1f CPU-s)", time.Since(t0).Seconds(), (benchrun.CPUTime() - cpu0).Seconds())
	}
	apparent, disk, err := benchrun.DiskUsage(dir)
	if err != nil {
		return err
	}
	where := "in this process"
	if c.process {
		where = "each a legato rl export process"
	}
	fmt.Fprintf(stdout, "export: %d rollouts × %d steps, groups of %d; run %s; %.1f KB per rollout (%.1f KB on disk); exports %s\n",
		c.run.Rollouts, c.run.Steps, c.run.Group, how,
		float64(apparent)/1e3/float64(c.run.Rollouts), float64(disk)/1e3/float64(c.run.Rollouts), where)
	// Fixed widths rather than a tabwriter: each line is printed as soon
	// as its export is measured.
	const row = "  %-10s %9s %8s %8s %10s %7s %7s %6s %7s %6s\n"
	fmt.Fprintf(stdout, row, "shape", "MB", "seconds", "MB/s", "rollouts/s", "CPU-s", "cat-s", "x-cat", "io-s", "x-io")
	for _, s := range benchShapes {
		if c.only != "" && c.only != "export" && c.only != s.name {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		out := filepath.Join(tmp, s.name+".jsonl")
		var (
			took, cpu time.Duration
			written   int64
			rollouts  int
		)
		if c.process {
			took, cpu, rollouts, err = exportProcess(ctx, dir, out, s.flags)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			fi, err := os.Stat(out)
			if err != nil {
				return err
			}
			written = fi.Size()
		} else {
			t0, cpu0 := time.Now(), benchrun.CPUTime()
			st, err := export.ExportSteps(dir, out, s.opts)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			took, cpu, written, rollouts = time.Since(t0), benchrun.CPUTime()-cpu0, st.Bytes, st.Rollouts
		}
		cat, err := benchrun.CopyTime(out)
		if err != nil {
			return err
		}
		// What the export must read (images stay references): with the
		// copy of what it wrote, the disk's bound for the export itself.
		read, _, err := benchrun.ReadTime(filepath.Join(dir, schema.RecordsFile), filepath.Join(dir, schema.MessagesDir), filepath.Join(dir, schema.TokensDir))
		if err != nil {
			return err
		}
		bound := cat + read
		if err := os.Remove(out); err != nil {
			return err
		}
		mb := float64(written) / 1e6
		f := func(format string, v float64) string { return fmt.Sprintf(format, v) }
		fmt.Fprintf(stdout, row, s.name, f("%.1f", mb), f("%.2f", took.Seconds()), f("%.1f", mb/took.Seconds()),
			f("%.0f", float64(rollouts)/took.Seconds()), f("%.2f", cpu.Seconds()), f("%.2f", cat.Seconds()), f("%.1f", took.Seconds()/cat.Seconds()),
			f("%.2f", bound.Seconds()), f("%.1f", took.Seconds()/bound.Seconds()))
	}
	return nil
}

// exportProcess runs `legato rl export DIR --out OUT flags...` (this
// program) and returns its wall and CPU time and the rollouts it wrote, as
// it prints them.
func exportProcess(ctx context.Context, dir, out string, flags []string) (took, cpu time.Duration, rollouts int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, 0, err
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{"rl", "export", dir, "--out", out}, flags...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, fmt.Errorf("legato rl export: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	took = time.Since(t0)
	m := regexp.MustCompile(`from (\d+) rollouts`).FindSubmatch(stdout.Bytes())
	if m == nil {
		return 0, 0, 0, fmt.Errorf("legato rl export said %q: no count of rollouts", stdout.String())
	}
	rollouts, _ = strconv.Atoi(string(m[1]))
	return took, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), rollouts, nil
}

// benchTasks are n feasible tasks for the fake desktops.
func benchTasks(n int) []rl.Task {
	ts := make([]rl.Task, n)
	for i := range ts {
		ts[i] = rl.Task{ID: fmt.Sprintf("bench-%d", i), Domain: "os", Instruction: fmt.Sprintf("do thing number %d", i),
			Evaluator: json.RawMessage(`{"func":"exact_match"}`)}
	}
	return ts
}

func (c *benchCommand) benchCommit(ctx context.Context, stdout io.Writer) error {
	const group, maxSteps, width, height = 4, 5, 320, 192
	dir, err := os.MkdirTemp("", "legato-bench-commit-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The scripted server stands in for one on its own machine: bounded,
	// it does not crowd the batch out of the scheduler (see
	// policytest.Options.Workers).
	workers := 2 * runtime.GOMAXPROCS(0)
	if c.workers.v != nil {
		workers = *c.workers.v
	}
	srv := policytest.NewPipeServer(policytest.Options{NoLatency: true, Workers: workers})
	defer srv.Close()
	fleet := fake.NewFleet(fake.Config{Width: width, Height: height, DefaultReward: fake.Reward{P: 0.5}, ReadyWaiter: true, Stepper: true})
	var (
		mu    sync.Mutex
		waits []time.Duration
	)
	opts := rl.CollectOptions{Out: filepath.Join(dir, "run"), NewDesktop: fleet.New, Desktops: c.desktops, Group: group, MaxSteps: maxSteps,
		OnCommitted: func(d time.Duration) {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
		}}
	pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "bench", StepTimeout: time.Hour, HTTPClient: srv.Client()}
	start := time.Now()
	sum, err := rl.Collect(ctx, benchTasks((c.attempts+group-1)/group), pol, opts)
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	graded := 0
	for s, n := range sum.Counts {
		if s.Graded() {
			graded += n
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) == 0 {
		return errors.New("no record was committed")
	}
	slices.Sort(waits)
	q := func(p float64) string {
		return fmt.Sprintf("%.0f ms", float64(waits[int(p*float64(len(waits)-1))].Microseconds())/1e3)
	}
	bound := "no bound"
	if workers > 0 {
		bound = strconv.Itoa(workers)
	}
	fmt.Fprintf(stdout, "commit: %d instant desktops (%dx%d screens), server workers %s, %d records: wait p50 %s, p90 %s, p99 %s, max %s; %.0f graded rollouts/s\n",
		c.desktops, width, height, bound, len(waits), q(0.5), q(0.9), q(0.99), q(1), float64(graded)/elapsed.Seconds())
	return nil
}

// benchOnlyNames lists --only's values.
func benchOnlyNames() string {
	names := []string{"export", "commit"}
	for _, s := range benchShapes {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// optInt is an int flag that tells "not given" (nil) from any value, 0
// included; it takes 0 or more.
type optInt struct{ v *int }

func (o *optInt) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.Itoa(*o.v)
}

func (o *optInt) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return errors.New("want an integer ≥ 0")
	}
	o.v = &n
	return nil
}
