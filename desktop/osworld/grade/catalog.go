package grade

import (
	"context"
	"errors"
	"fmt"

	"legato/rl/desktop"
)

// Mode chooses between OSWorld's Python evaluators (through the bridge) and
// the native Go ones, for metrics both can run.
type Mode int

const (
	// PreferBridge runs a metric with OSWorld's own Python code when the
	// checkout provides it and it imports, natively otherwise. The zero
	// value: the reward is OSWorld's wherever possible.
	PreferBridge Mode = iota
	// PreferNative runs natively what Go implements (no Python process for
	// the common metrics) and the rest through the bridge.
	PreferNative
	// NativeOnly never starts Python; tasks needing anything else are
	// refused.
	NativeOnly
)

func (m Mode) String() string {
	switch m {
	case PreferBridge:
		return "bridge"
	case PreferNative:
		return "native"
	case NativeOnly:
		return "native-only"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "bridge", "native" or "native-only" (a flag's value).
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{PreferBridge, PreferNative, NativeOnly} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("grader mode %q: want bridge, native or native-only", s)
}

// Catalog knows which metrics and getters a grader can run, and where.
// Build it once before a batch with LoadCatalog, refuse the tasks Check
// rejects, and share it with every desktop's grader through
// GraderConfig.Catalog.
type Catalog struct {
	mode Mode
	// checkout is set when an OSWorld checkout was listed.
	checkout string
	// For the checkout: name → "" when it imports, else why not; missing
	// names the module a name lacks.
	metrics map[string]string
	getters map[string]string
	missing map[string]string
}

func newCatalog(mode Mode, checkout string, l *evaluatorLists) *Catalog {
	return &Catalog{mode: mode, checkout: checkout, metrics: l.metrics, getters: l.getters, missing: l.missing}
}

// runner is where one metric runs.
type runner int

const (
	runNative runner = iota
	runBridge
)

func (r runner) String() string {
	if r == runBridge {
		return "bridge"
	}
	return "native"
}

// LoadCatalog lists what cfg's grader can run: the native getters and
// metrics and, with an OSWorld checkout (unless cfg.Mode is NativeOnly),
// what the checkout provides and imports. With cfg.Pool it waits for the
// pool's first worker, which lists the checkout as it starts; without, it
// starts one Python process that imports every evaluator module once.
func LoadCatalog(ctx context.Context, cfg GraderConfig) (*Catalog, error) {
	cfg.Catalog = nil
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return g.loadCatalog(ctx)
}

// NativeCatalog is the catalog of a grader without an OSWorld checkout.
func NativeCatalog() *Catalog { return &Catalog{mode: NativeOnly} }

// Checkout returns the OSWorld checkout the catalog lists, "" if none.
func (c *Catalog) Checkout() string { return c.checkout }

// Check reports whether task can be graded: its evaluator parses, and every
// metric and getter it names is native or importable from the checkout.
// The error, an *UnsupportedError, names the task and the metric.
func (c *Catalog) Check(task desktop.Task) error {
	ev, err := ParseEvaluator(task.Evaluator)
	if err != nil {
		return &UnsupportedError{TaskID: task.ID, Reason: err.Error()}
	}
	_, err = c.plan(task.ID, ev, nil)
	return err
}

// CheckTasks checks every task and joins the errors.
func (c *Catalog) CheckTasks(tasks []desktop.Task) error {
	var errs []error
	for _, t := range tasks {
		if err := c.Check(t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// plan chooses where each metric of ev runs. extra are native metrics
// beyond the built-in ones.
func (c *Catalog) plan(taskID string, ev *Evaluator, extra map[string]nativeMetric) ([]runner, error) {
	runners := make([]runner, len(ev.Metrics))
	for i, m := range ev.Metrics {
		getters := []string{m.Result.Type}
		if m.Expected != nil {
			getters = append(getters, m.Expected.Type)
		}
		native := c.nativeMissing(m.Func, getters, extra)
		bridge := c.bridgeMissing(m.Func, getters)
		switch {
		case c.mode == PreferBridge && bridge == nil:
			runners[i] = runBridge
		case native == nil:
			runners[i] = runNative
		case c.mode != NativeOnly && bridge == nil:
			runners[i] = runBridge
		default:
			return nil, c.refusal(taskID, m.Func, native, bridge)
		}
	}
	return runners, nil
}

// missing says what keeps a metric from running one way: the metric itself
// (getter "") or one of its getters, and why.
type missing struct {
	getter, reason string
}

func (c *Catalog) nativeMissing(metric string, getters []string, extra map[string]nativeMetric) *missing {
	_, isExtra := extra[metric]
	if _, ok := nativeMetricFor(metric); !ok && !isExtra {
		return &missing{reason: "not implemented natively"}
	}
	for _, g := range getters {
		if _, ok := nativeGetterFor(g); !ok {
			return &missing{getter: g, reason: "not implemented natively"}
		}
	}
	return nil
}

func (c *Catalog) bridgeMissing(metric string, getters []string) *missing {
	switch {
	case c.mode == NativeOnly:
		return &missing{reason: "native-only grading"}
	case c.checkout == "":
		return &missing{reason: "no OSWorld checkout given (--osworld DIR)"}
	}
	check := func(table map[string]string, name, what string) string {
		reason, ok := table[name]
		if !ok {
			return fmt.Sprintf("the OSWorld checkout has no %s %q", what, name)
		}
		if reason != "" {
			return "the OSWorld checkout fails to import it: " + reason
		}
		return ""
	}
	if r := check(c.metrics, metric, "metric"); r != "" {
		return &missing{reason: r}
	}
	for _, g := range getters {
		if r := check(c.getters, g, "getter"); r != "" {
			return &missing{getter: g, reason: r}
		}
	}
	return nil
}

func (c *Catalog) refusal(taskID, metric string, native, bridge *missing) error {
	// Name the getter when the metric itself could run somewhere.
	getter := native.getter
	if getter == "" {
		getter = bridge.getter
	}
	reason := native.reason + "; " + bridge.reason
	if native.getter != bridge.getter {
		reason = fmt.Sprintf("natively: %s%s; through the bridge: %s%s",
			about(native.getter), native.reason, about(bridge.getter), bridge.reason)
	}
	return &UnsupportedError{TaskID: taskID, Metric: metric, Getter: getter, Reason: reason}
}

func about(getter string) string {
	if getter == "" {
		return ""
	}
	return fmt.Sprintf("getter %q ", getter)
}
