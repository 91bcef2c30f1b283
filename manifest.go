package rl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"legato/rl/policy"
	"legato/rl/schema"
)

// manifestName is the file in a run directory that says which batch it
// holds, so that collecting into it again continues that batch and nothing
// else.
const manifestName = schema.BatchFile

// manifest identifies a batch: the same tasks (by id and content), the same
// policy, the same group shape.
type manifest struct {
	Schema   string   `json:"schema"`
	Model    string   `json:"model"`
	Version  string   `json:"version"`
	Group    int      `json:"group"`
	Attempts int      `json:"attempts_per_task"`
	TaskIDs  []string `json:"task_ids"`
	TasksSHA string   `json:"tasks_sha256"`
	// ErrorReruns is how often a later collect reruns an attempt whose
	// record is an error, fixed by the batch's first run.
	ErrorReruns int `json:"error_reruns"`
	// Sampling is what the requests asked of the server beyond the model
	// (temperature, top-p, max tokens); Harness what shaped the prompts
	// (policy.Describer). A batch mixing two would mix two policies.
	Sampling sampling `json:"sampling"`
	Harness  string   `json:"harness,omitempty"`
}

// sampling is the part of the policy block a batch must keep.
type sampling struct {
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
}

func (s sampling) String() string {
	f := func(v *float64) string {
		if v == nil {
			return "server default"
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	return fmt.Sprintf("temperature %s, top-p %s, max tokens %d", f(s.Temperature), f(s.TopP), s.MaxTokens)
}

func manifestFor(tasks []Task, pol PolicyConfig, opts CollectOptions, harness policy.Harness) manifest {
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
	return manifest{
		Schema:      "legato.batch/v0",
		Model:       pol.Model,
		Version:     pol.Version,
		Group:       opts.Group,
		Attempts:    AttemptsPerTask(opts.Group, opts.Oversample),
		TaskIDs:     ids,
		TasksSHA:    hex.EncodeToString(h.Sum(nil)),
		ErrorReruns: max(opts.ErrorReruns, 0),
		Sampling:    sampling{Temperature: pol.Temperature, TopP: pol.TopP, MaxTokens: pol.MaxTokens},
		Harness:     harnessDescription(harness),
	}
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
func readManifest(dir string) (*manifest, error) {
	path := filepath.Join(dir, manifestName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if fi, serr := os.Stat(filepath.Join(dir, schema.RecordsFile)); serr == nil && fi.Size() > 0 {
			return nil, fmt.Errorf("%s holds rollouts.jsonl but no %s: not a legato batch this version can continue; use a new --out", dir, manifestName)
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// A manifest written before error reruns existed reruns as many as
	// today's default.
	m := manifest{ErrorReruns: DefaultErrorReruns}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &m, nil
}

// sameBatch refuses to continue old, the batch in dir, with m.
func (old *manifest) sameBatch(dir string, m manifest) error {
	var diffs []string
	if old.Version != m.Version {
		diffs = append(diffs, fmt.Sprintf("policy version %q, not %q", old.Version, m.Version))
	}
	if old.Model != m.Model {
		diffs = append(diffs, fmt.Sprintf("model %q, not %q", old.Model, m.Model))
	}
	if o, n := old.Sampling.String(), m.Sampling.String(); o != n {
		diffs = append(diffs, fmt.Sprintf("sampling %s, not %s", o, n))
	}
	if old.Harness != m.Harness {
		diffs = append(diffs, fmt.Sprintf("harness %q, not %q", old.Harness, m.Harness))
	}
	if old.Group != m.Group || old.Attempts != m.Attempts {
		diffs = append(diffs, fmt.Sprintf("groups of %d with %d attempts per task, not %d with %d", old.Group, old.Attempts, m.Group, m.Attempts))
	}
	if old.TasksSHA != m.TasksSHA {
		if strings.Join(old.TaskIDs, "\n") == strings.Join(m.TaskIDs, "\n") {
			diffs = append(diffs, "the same task ids but changed task configs")
		} else {
			diffs = append(diffs, fmt.Sprintf("a different task list (%d tasks, not %d)", len(old.TaskIDs), len(m.TaskIDs)))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s holds another batch: %s; collect into a new --out directory, or rerun with the batch's own tasks and version to continue it",
			dir, strings.Join(diffs, "; "))
	}
	return nil
}

// writeManifest writes m as the run's batch.json, atomically.
func writeManifest(run *schema.Run, m manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return run.WriteFile(manifestName, append(data, '\n'))
}
