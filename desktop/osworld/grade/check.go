package grade

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"legato/rl/desktop"
)

// CheckConfig says what Check looks at: the graders a batch would have.
type CheckConfig struct {
	// OSWorldDir, Python, Mode and BytecodeDir are as in GraderConfig.
	OSWorldDir  string
	Python      string
	Mode        Mode
	BytecodeDir string
	// Tasks, if any, are checked one by one.
	Tasks []desktop.Task
	// Logger receives the Python worker's lifecycle; nil discards.
	Logger *slog.Logger
}

// CheckReport says what will grade where, before a batch: which Python
// runs OSWorld's evaluators, which metrics and getters import (and why not),
// which run natively, and what each task would do.
type CheckReport struct {
	// Checkout is the OSWorld checkout whose evaluators run; "" when
	// grading natively only.
	Checkout string `json:"checkout,omitempty"`
	// Mode chooses between Python and native code.
	Mode string `json:"mode"`
	// Python is the interpreter of the evaluators; zero when none runs.
	Python Interpreter `json:"python"`
	// WorkerRSS is the resident memory, in bytes, of one Python worker
	// that imported every evaluator module; 0 when unknown. A pool holds
	// PoolConfig.Workers of them.
	WorkerRSS int64 `json:"worker_rss,omitempty"`
	// Metrics and Getters are every name the checkout defines or legato
	// implements, sorted.
	Metrics []NameReport `json:"metrics"`
	Getters []NameReport `json:"getters"`
	// Tasks are the checked tasks, in order.
	Tasks []TaskReport `json:"tasks,omitempty"`
}

// NameReport says where one metric or getter can run.
type NameReport struct {
	Name string `json:"name"`
	// Native reports whether legato implements it in Go.
	Native bool `json:"native"`
	// InCheckout reports whether the checkout defines it, Imports whether
	// it also imports with the interpreter.
	InCheckout bool `json:"in_checkout"`
	Imports    bool `json:"imports"`
	// Reason says why it does not import; Missing names the module it
	// lacks, when that is why.
	Reason  string `json:"reason,omitempty"`
	Missing string `json:"missing,omitempty"`
	// Via is where it runs in this mode: ViaPython, ViaNative, or "" when
	// it cannot run (for a metric, its getters aside).
	Via string `json:"via"`
}

// TaskReport says how one task would be graded.
type TaskReport struct {
	ID string `json:"id"`
	// Metrics says where each of the task's metrics would run.
	Metrics []desktop.MetricRun `json:"metrics,omitempty"`
	// Refused says why the batch would refuse the task; "" when it can be
	// graded.
	Refused string `json:"refused,omitempty"`
}

// Check reports what graders configured like cfg would do, without any
// desktop: with an OSWorld checkout it starts one Python worker, which
// imports every evaluator module as a pool's workers do, and stops it.
// Its error is about the check itself (no interpreter, a checkout that
// cannot be listed); refused tasks are in the report.
func Check(ctx context.Context, cfg CheckConfig) (*CheckReport, error) {
	gcfg := GraderConfig{OSWorldDir: cfg.OSWorldDir, Mode: cfg.Mode}
	if err := gcfg.Validate(); err != nil {
		return nil, err
	}
	rep := &CheckReport{Mode: cfg.Mode.String()}
	cat := &Catalog{mode: cfg.Mode}
	if cfg.OSWorldDir != "" && cfg.Mode != NativeOnly {
		p, err := newPool(PoolConfig{OSWorldDir: cfg.OSWorldDir, Python: cfg.Python, Workers: 1, BytecodeDir: cfg.BytecodeDir, Logger: cfg.Logger}, false)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		lists, err := p.evaluators(ctx)
		if err != nil {
			return nil, err
		}
		cat = newCatalog(cfg.Mode, p.Checkout(), lists)
		rep.Checkout, rep.Python = p.Checkout(), p.Interpreter()
		if st := p.Stats(); len(st.RSS) > 0 {
			rep.WorkerRSS = st.RSS[0]
		}
	}
	rep.Metrics = cat.names(cat.metrics, NativeMetrics(), func(name string) string {
		switch {
		case cat.mode == PreferBridge && cat.bridgeMissing(name, nil) == nil:
			return ViaPython
		case cat.nativeMissing(name, nil, nil) == nil:
			return ViaNative
		case cat.mode != NativeOnly && cat.bridgeMissing(name, nil) == nil:
			return ViaPython
		}
		return ""
	})
	rep.Getters = cat.names(cat.getters, NativeGetters(), func(name string) string {
		_, native := nativeGetterFor(name)
		imports := cat.mode != NativeOnly && cat.getters[name] == "" && cat.hasGetter(name)
		switch {
		case cat.mode == PreferBridge && imports:
			return ViaPython
		case native:
			return ViaNative
		case imports:
			return ViaPython
		}
		return ""
	})
	for _, t := range cfg.Tasks {
		rep.Tasks = append(rep.Tasks, cat.taskReport(t))
	}
	return rep, nil
}

func (c *Catalog) hasGetter(name string) bool {
	_, ok := c.getters[name]
	return ok
}

// names reports every name of a kind: the checkout's and the native ones.
func (c *Catalog) names(checkout map[string]string, native []string, via func(string) string) []NameReport {
	all := map[string]bool{}
	for n := range checkout {
		all[n] = true
	}
	for _, n := range native {
		all[n] = true
	}
	var out []NameReport
	for _, n := range slices.Sorted(maps.Keys(all)) {
		reason, in := checkout[n]
		out = append(out, NameReport{
			Name: n, Native: slices.Contains(native, n), InCheckout: in, Imports: in && reason == "",
			Reason: reason, Missing: c.missing[n], Via: via(n),
		})
	}
	return out
}

// taskReport plans task as a grader would.
func (c *Catalog) taskReport(task desktop.Task) TaskReport {
	r := TaskReport{ID: task.ID}
	ev, err := ParseEvaluator(task.Evaluator)
	if err != nil {
		r.Refused = (&UnsupportedError{TaskID: task.ID, Reason: err.Error()}).Error()
		return r
	}
	if ev.Infeasible {
		return r
	}
	runners, err := c.plan(task.ID, ev, nil)
	if err != nil {
		r.Refused = err.Error()
		return r
	}
	for i, m := range ev.Metrics {
		via := ViaNative
		if runners[i] == runBridge {
			via = ViaPython
		}
		r.Metrics = append(r.Metrics, desktop.MetricRun{Metric: m.Func, Via: via})
	}
	return r
}

// Refused returns the tasks the batch would refuse.
func (r *CheckReport) Refused() []TaskReport {
	var out []TaskReport
	for _, t := range r.Tasks {
		if t.Refused != "" {
			out = append(out, t)
		}
	}
	return out
}

// WriteText writes the report for a person: the interpreter, the modules
// missing (the fix), the metrics and getters, and the refused tasks.
func (r *CheckReport) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if r.Checkout == "" {
		ew.printf("grading natively only (no OSWorld checkout, or native-only mode): no Python runs\n")
	} else {
		py := r.Python
		ew.printf("python:     %s (found at %s) runs %s, Python %s\n", py.Command, py.Path, py.Executable, py.Version)
		ew.printf("checkout:   %s\n", r.Checkout)
		if r.WorkerRSS > 0 {
			ew.printf("memory:     %.0f MiB per worker with every evaluator module imported\n", float64(r.WorkerRSS)/(1<<20))
		}
	}
	ew.printf("mode:       %s\n\n", r.Mode)
	for _, kind := range []struct {
		name  string
		items []NameReport
	}{{"metrics", r.Metrics}, {"getters", r.Getters}} {
		r.writeKind(ew, kind.name, kind.items)
	}
	if len(r.Tasks) > 0 {
		refused := r.Refused()
		vias := map[string]int{}
		for _, t := range r.Tasks {
			for _, m := range t.Metrics {
				vias[m.Via]++
			}
		}
		ew.printf("tasks: %d checked, %d would be refused; their metrics would run %d through Python, %d natively\n",
			len(r.Tasks), len(refused), vias[ViaPython], vias[ViaNative])
		for _, t := range refused {
			ew.printf("  refused: %s\n", t.Refused)
		}
	}
	return ew.err
}

func (r *CheckReport) writeKind(ew *errWriter, kind string, items []NameReport) {
	var inCheckout, imports, native, python, nat, none int
	missing := map[string]int{}
	for _, n := range items {
		if n.InCheckout {
			inCheckout++
		}
		if n.Imports {
			imports++
		}
		if n.Native {
			native++
		}
		switch n.Via {
		case ViaPython:
			python++
		case ViaNative:
			nat++
		default:
			none++
		}
		if n.Missing != "" {
			missing[n.Missing]++
		}
	}
	ew.printf("%s: %d in the checkout, %d of them import; %d native; %d run through Python, %d natively, %d nowhere\n",
		kind, inCheckout, imports, native, python, nat, none)
	if len(missing) > 0 {
		mods := slices.SortedFunc(maps.Keys(missing), func(a, b string) int {
			return cmp.Or(missing[b]-missing[a], strings.Compare(a, b))
		})
		var parts []string
		for _, m := range mods {
			parts = append(parts, fmt.Sprintf("%s (%d)", m, missing[m]))
		}
		ew.printf("  missing Python modules: %s\n", strings.Join(parts, ", "))
	}
	tw := tabwriter.NewWriter(ew, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  NAME\tRUNS\tIMPORTS\tNATIVE\tWHY NOT\n")
	for _, n := range items {
		runs := n.Via
		if runs == "" {
			runs = "-"
		}
		imp := "no"
		switch {
		case n.Imports:
			imp = "yes"
		case !n.InCheckout:
			imp = "-"
		}
		why := n.Reason
		if n.Missing != "" {
			why = "no module " + n.Missing
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", n.Name, runs, imp, yesNo(n.Native), why)
	}
	tw.Flush()
	ew.printf("\n")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
