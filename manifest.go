package rl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"legato/rl/policy"
	"legato/rl/schema"
)

// manifestName is the file in a run directory that says which batch it
// holds, so that collecting into it again continues that batch and nothing
// else. Its format is schema.Batch's.
const manifestName = schema.BatchFile

// manifestFor describes the batch collect is asked to run: the same tasks
// (by id and content), the same policy, the same group shape, and every
// knob that changes an attempt's data.
func manifestFor(tasks []Task, pol PolicyConfig, opts CollectOptions, harness policy.Harness) schema.Batch {
	h := sha256.New()
	ids := make([]string, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
		// The raw config when there is one: a task edited between runs is
		// a different task.
		raw := t.Raw
		if len(raw) == 0 {
			raw, _ = json.Marshal(t)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", t.ID, len(raw))
		h.Write(raw)
	}
	reruns := max(opts.ErrorReruns, 0)
	return schema.Batch{
		Schema:         schema.BatchVersion,
		Model:          pol.Model,
		Version:        pol.Version,
		Group:          opts.Group,
		Attempts:       AttemptsPerTask(opts.Group, opts.Oversample),
		TaskIDs:        ids,
		TasksSHA:       hex.EncodeToString(h.Sum(nil)),
		ErrorReruns:    &reruns,
		Sampling:       schema.Sampling{Temperature: pol.Temperature, TopP: pol.TopP, MaxTokens: pol.MaxTokens, Extra: extraJSON(pol.Extra)},
		Harness:        harnessDescription(harness),
		MaxSteps:       opts.MaxSteps,
		RolloutTimeout: opts.RolloutTimeout.String(),
		Environment:    opts.Environment,
		// As given: "" until batchManifest resolves it against the batch's
		// own (keptAdvantageStd).
		AdvantageStd: opts.AdvantageStd,
	}
}

// extraJSON is the policy's extra request fields as canonical JSON (maps
// marshal with sorted keys), "" when there are none.
func extraJSON(extra map[string]any) string {
	if len(extra) == 0 {
		return ""
	}
	b, err := json.Marshal(extra)
	if err != nil {
		// policy.Config.Validate refused it already; say so rather than
		// record nothing.
		return fmt.Sprintf("unencodable: %v", err)
	}
	return string(b)
}

// harnessDescription is what a harness says shapes its prompts, "" when it
// does not say.
func harnessDescription(h policy.Harness) string {
	if d, ok := h.(policy.Describer); ok {
		return d.Describe()
	}
	return ""
}

// readManifest reads the manifest of the batch in dir; nil when dir holds
// none (a new batch).
func readManifest(dir string) (*schema.Batch, error) {
	b, err := schema.ReadBatch(dir)
	if err != nil || b != nil {
		return b, err
	}
	if fi, serr := os.Stat(filepath.Join(dir, schema.RecordsFile)); serr == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("%s holds rollouts.jsonl but no %s: not a legato batch this version can continue; use a new --out", dir, manifestName)
	}
	return nil, nil
}

// errorReruns is the batch's bound on error reruns; a manifest written
// before reruns existed reruns as many as today's default.
func errorReruns(b *schema.Batch) int {
	if b.ErrorReruns == nil {
		return DefaultErrorReruns
	}
	return *b.ErrorReruns
}

// sameBatch refuses to continue old, the batch in dir, with m. A knob that
// old does not record (a batch.json older than the knob) is taken from m:
// the older legato did not vary it within a run, and refusing would strand
// every batch it started; collect logs which ones were taken (unrecorded).
func sameBatch(dir string, old *schema.Batch, m schema.Batch) error {
	var diffs []string
	differ := func(what string, o, n any) {
		diffs = append(diffs, fmt.Sprintf("%s %v, not %v", what, o, n))
	}
	if old.Version != m.Version {
		differ("policy version", fmt.Sprintf("%q", old.Version), fmt.Sprintf("%q", m.Version))
	}
	if old.Model != m.Model {
		differ("model", fmt.Sprintf("%q", old.Model), fmt.Sprintf("%q", m.Model))
	}
	if o, n := old.Sampling.String(), m.Sampling.String(); o != n {
		diffs = append(diffs, fmt.Sprintf("sampling %s, not %s", o, n))
	}
	if old.Harness != m.Harness {
		differ("harness", fmt.Sprintf("%q", old.Harness), fmt.Sprintf("%q", m.Harness))
	}
	if old.MaxSteps != 0 && old.MaxSteps != m.MaxSteps {
		differ("--max-steps", old.MaxSteps, m.MaxSteps)
	}
	if old.RolloutTimeout != "" && old.RolloutTimeout != m.RolloutTimeout {
		differ("--rollout-timeout", old.RolloutTimeout, m.RolloutTimeout)
	}
	if old.Group != m.Group || old.Attempts != m.Attempts {
		diffs = append(diffs, fmt.Sprintf("groups of %d with %d attempts per task, not %d with %d", old.Group, old.Attempts, m.Group, m.Attempts))
	}
	diffs = append(diffs, environmentChanges(old.Environment, m.Environment)...)
	if o := old.AdvantageStd.OrDefault(); m.AdvantageStd != "" && m.AdvantageStd != o {
		// Its earlier groups' advantages, delivered already, have the
		// other scale.
		differ("--advantage-std", o, m.AdvantageStd)
	}
	if old.TasksSHA != m.TasksSHA {
		if strings.Join(old.TaskIDs, "\n") == strings.Join(m.TaskIDs, "\n") {
			diffs = append(diffs, "the same task ids but changed task configs")
		} else {
			diffs = append(diffs, fmt.Sprintf("a different task list (%d tasks, not %d)", len(old.TaskIDs), len(m.TaskIDs)))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: %s holds another batch: %s; collect into a new --out directory, or rerun with the batch's own tasks, version and settings to continue it",
			ErrInvalidOptions, dir, strings.Join(diffs, "; "))
	}
	return nil
}

// continueBatch refuses to continue old, the batch in dir whose settings
// file (batch.json, a service's journal) is named by where, with m
// (sameBatch), and warns of the settings old does not record, which m now
// fixes.
func continueBatch(dir, where string, old *schema.Batch, m schema.Batch, log *slog.Logger) error {
	if err := sameBatch(dir, old, m); err != nil {
		return err
	}
	if knobs := unrecorded(old); len(knobs) > 0 {
		// Collect's batch.json then records them; a service's journal
		// keeps its first line.
		log.Warn(where+" predates recording these settings: they could not be checked against the batch's earlier runs", "settings", strings.Join(knobs, " "))
	}
	if old.Environment == nil && m.Environment != nil {
		log.Warn(where+" does not record the batch's desktops (an older legato wrote it): the environment could not be checked against the earlier runs'; make sure --backend and its knobs are theirs",
			"backend", m.Environment.Backend)
	}
	return nil
}

// environmentChanges lists how n, this run's desktops, differs from old,
// the batch's, each naming the knob and both values; none when old is not
// recorded (continueBatch warns).
func environmentChanges(old, n *schema.Environment) []string {
	switch {
	case old == nil:
		return nil
	case n == nil:
		return []string{fmt.Sprintf("desktops of backend %q, not undescribed ones (CollectOptions.Environment)", old.Backend)}
	case old.Backend != n.Backend:
		return []string{fmt.Sprintf("--backend %s, not %s", old.Backend, n.Backend)}
	}
	knobs := map[string]bool{}
	for _, m := range []map[string]string{old.Knobs, n.Knobs} {
		for k := range m {
			knobs[k] = true
		}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(knobs)) {
		if o, v := knobValue(old.Knobs, k), knobValue(n.Knobs, k); o != v {
			out = append(out, fmt.Sprintf("--%s %s, not %s", k, o, v))
		}
	}
	return out
}

// knobValue is knob k of knobs as an error shows it.
func knobValue(knobs map[string]string, k string) string {
	v, ok := knobs[k]
	switch {
	case !ok:
		return "unset"
	case v == "":
		return `""`
	}
	return v
}

// keptAdvantageStd is the advantage std a batch runs with: the one old,
// its settings, recorded (sameBatch refused another), or for a new batch
// (old nil) the one asked for, PopulationStd by default. A kind old
// records that this legato does not know (a hand-edited file) is an
// error: its advantages would silently change scale.
func keptAdvantageStd(where string, old *schema.Batch, asked schema.AdvantageStd) (schema.AdvantageStd, error) {
	if old == nil {
		return asked.OrDefault(), nil
	}
	if old.AdvantageStd == "" {
		return schema.PopulationStd, nil
	}
	k, err := schema.ParseAdvantageStd(string(old.AdvantageStd))
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	return k, nil
}

// unrecorded lists the knobs old's batch.json does not record, which this
// run's values now fix.
func unrecorded(old *schema.Batch) []string {
	var out []string
	if old.MaxSteps == 0 {
		out = append(out, "--max-steps")
	}
	if old.RolloutTimeout == "" {
		out = append(out, "--rollout-timeout")
	}
	return out
}
