package grade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"legato/rl/desktop"
)

// Conjunctions of a list of metrics.
const (
	// And scores 0 as soon as one metric scores 0, else the mean.
	And = "and"
	// Or scores 1 as soon as one metric scores 1, else the maximum.
	Or = "or"
)

// Evaluator is an OSWorld task's "evaluator", normalized: a single metric
// and a list of one metric are both one entry in Metrics (List tells them
// apart, because OSWorld combines them differently).
type Evaluator struct {
	// Infeasible is set for "func": "infeasible": the reward is 1 exactly
	// when the agent's last action was FAIL.
	Infeasible bool
	// List reports whether "func" was a list.
	List bool
	// Conj is And or Or; it applies to lists. OSWorld's default is And.
	Conj string
	// Metrics are the metrics in the order OSWorld runs them.
	Metrics []Metric
	// PostConfig are setup steps run before grading (saving the open
	// document, closing an app).
	PostConfig []desktop.SetupStep
}

// Metric is one metric with the getters that feed it.
type Metric struct {
	// Func is the metric's name in desktop_env.evaluators.metrics.
	Func string
	// Result is the getter of the state to grade.
	Result Getter
	// Expected is the getter of the reference; nil when the metric is
	// called without one: metric(result, **options).
	Expected *Getter
	// Options are the metric's keyword arguments, a JSON object.
	Options json.RawMessage
}

// Getter is one getter config: {"type": "vm_file", "path": ..., ...}. It
// runs as get_<type>(env, config).
type Getter struct {
	Type string
	// Config is the whole config object as written in the task.
	Config json.RawMessage
}

// rawEvaluator is the task JSON; fields that may be a value or a list stay
// raw until we know which.
type rawEvaluator struct {
	Func       json.RawMessage     `json:"func"`
	Conj       *string             `json:"conj"`
	Result     json.RawMessage     `json:"result"`
	Expected   json.RawMessage     `json:"expected"`
	Options    json.RawMessage     `json:"options"`
	PostConfig []desktop.SetupStep `json:"postconfig"`
}

// ParseEvaluator parses a task's evaluator. It accepts what OSWorld can run
// and refuses, with the offending field named, what OSWorld would crash on
// (a list of metrics with a result list of another length, a missing
// result). Two leniencies, where OSWorld would crash: a null entry in a list
// of "expected" getters means that metric gets no expected value, and null
// options mean none.
func ParseEvaluator(raw json.RawMessage) (*Evaluator, error) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, errors.New("no evaluator")
	}
	if !utf8.Valid(raw) {
		// Python could not even read such a task file as text.
		return nil, errors.New("evaluator: not UTF-8 text")
	}
	var r rawEvaluator
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("evaluator: %w", err)
	}
	ev := &Evaluator{Conj: And, PostConfig: r.PostConfig}
	if r.Conj != nil {
		if *r.Conj != And && *r.Conj != Or {
			return nil, fmt.Errorf("evaluator conj %q: want %q or %q", *r.Conj, And, Or)
		}
		ev.Conj = *r.Conj
	}
	for i, s := range r.PostConfig {
		if s.Type == "" {
			return nil, fmt.Errorf("evaluator postconfig[%d]: no type", i)
		}
	}

	var funcs []string
	switch kind(r.Func) {
	case '"':
		var f string
		_ = json.Unmarshal(r.Func, &f)
		if f == "infeasible" {
			ev.Infeasible = true
			return ev, nil
		}
		funcs = []string{f}
	case '[':
		if err := json.Unmarshal(r.Func, &funcs); err != nil {
			return nil, fmt.Errorf("evaluator func: want a name or a list of names: %w", err)
		}
		if len(funcs) == 0 {
			return nil, errors.New("evaluator func: empty list")
		}
		ev.List = true
	default:
		return nil, errors.New("evaluator func: want a metric name or a list of names")
	}
	for i, f := range funcs {
		if f == "" {
			return nil, fmt.Errorf("evaluator func[%d]: empty name", i)
		}
	}

	results, err := splitGetters("result", r.Result, ev.List, len(funcs), false)
	if err != nil {
		return nil, err
	}
	expected, err := splitGetters("expected", r.Expected, ev.List, len(funcs), true)
	if err != nil {
		return nil, err
	}
	options, err := splitOptions(r.Options, ev.List, len(funcs))
	if err != nil {
		return nil, err
	}
	for i, f := range funcs {
		if results[i] == nil {
			return nil, fmt.Errorf("evaluator result: none for metric %s", f)
		}
		ev.Metrics = append(ev.Metrics, Metric{Func: f, Result: *results[i], Expected: expected[i], Options: options[i]})
	}
	return ev, nil
}

// kind returns the first byte of a JSON value ('"', '[', '{', 'n', ...), 0
// when absent.
func kind(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// splitGetters returns one getter (or nil) per metric. OSWorld treats an
// absent, empty or null field as "none"; optional says whether that is
// allowed.
func splitGetters(field string, raw json.RawMessage, list bool, n int, optional bool) ([]*Getter, error) {
	out := make([]*Getter, n)
	switch k := kind(raw); {
	case k == 0 || k == 'n' || (k == '{' && isEmptyObject(raw)) || (k == '[' && isEmptyList(raw)):
		if !optional {
			return nil, fmt.Errorf("evaluator %s: missing", field)
		}
		return out, nil
	case list && k != '[':
		return nil, fmt.Errorf("evaluator %s: func is a list, so %s must be a list too", field, field)
	case !list && k != '{':
		return nil, fmt.Errorf("evaluator %s: want a getter object", field)
	case !list:
		g, err := parseGetter(field, raw)
		if err != nil {
			return nil, err
		}
		out[0] = g
		return out, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("evaluator %s: %w", field, err)
	}
	if len(items) != n {
		return nil, fmt.Errorf("evaluator %s: %d entries for %d metrics", field, len(items), n)
	}
	for i, item := range items {
		name := fmt.Sprintf("%s[%d]", field, i)
		if k := kind(item); k == 'n' || (k == '{' && isEmptyObject(item)) {
			if !optional {
				return nil, fmt.Errorf("evaluator %s: missing", name)
			}
			continue
		}
		g, err := parseGetter(name, item)
		if err != nil {
			return nil, err
		}
		out[i] = g
	}
	return out, nil
}

func parseGetter(field string, raw json.RawMessage) (*Getter, error) {
	var g struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, fmt.Errorf("evaluator %s: %w", field, err)
	}
	if g.Type == "" {
		return nil, fmt.Errorf("evaluator %s: getter has no type", field)
	}
	return &Getter{Type: g.Type, Config: append(json.RawMessage(nil), raw...)}, nil
}

func splitOptions(raw json.RawMessage, list bool, n int) ([]json.RawMessage, error) {
	empty := json.RawMessage("{}")
	out := make([]json.RawMessage, n)
	for i := range out {
		out[i] = empty
	}
	switch k := kind(raw); {
	case k == 0 || k == 'n':
		return out, nil
	case !list && k == '{':
		out[0] = append(json.RawMessage(nil), raw...)
		return out, nil
	case !list:
		return nil, errors.New("evaluator options: want an object")
	case k != '[':
		return nil, errors.New("evaluator options: func is a list, so options must be a list too")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("evaluator options: %w", err)
	}
	if len(items) != n {
		return nil, fmt.Errorf("evaluator options: %d entries for %d metrics", len(items), n)
	}
	for i, item := range items {
		switch kind(item) {
		case 'n':
		case '{':
			out[i] = append(json.RawMessage(nil), item...)
		default:
			return nil, fmt.Errorf("evaluator options[%d]: want an object", i)
		}
	}
	return out, nil
}

func isEmptyObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && len(m) == 0
}

func isEmptyList(raw json.RawMessage) bool {
	var l []json.RawMessage
	return json.Unmarshal(raw, &l) == nil && len(l) == 0
}
