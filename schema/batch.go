package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// BatchVersion is the schema of batch.json.
const BatchVersion = "legato.batch/v0"

// Batch is batch.json: what a batch is, so that collecting into its run
// directory again continues that batch and nothing else, and a summary
// knows its tasks before each has a record. It is the one description of
// the file: collect writes it and every reader reads it through ReadBatch.
//
// Every knob that changes the data of an attempt is here, so a resume with
// another value is refused rather than mixed into a group's advantages.
// Fields added after the first release are pointers or omitempty: absent in
// an older batch.json, which says nothing about them.
type Batch struct {
	Schema   string   `json:"schema"`
	Model    string   `json:"model"`
	Version  string   `json:"version"`
	Group    int      `json:"group"`
	Attempts int      `json:"attempts_per_task"`
	TaskIDs  []string `json:"task_ids"`
	TasksSHA string   `json:"tasks_sha256"`
	// ErrorReruns is how often a later collect reruns an attempt whose
	// record is an error, fixed by the batch's first run; nil in a
	// batch.json written before reruns existed.
	ErrorReruns *int `json:"error_reruns,omitempty"`
	// Sampling is what the requests asked of the server beyond the model;
	// Harness what shaped the prompts (policy.Describer).
	Sampling Sampling `json:"sampling"`
	Harness  string   `json:"harness,omitempty"`
	// MaxSteps bounds an attempt's model calls (--max-steps); 0 when not
	// recorded.
	MaxSteps int `json:"max_steps,omitempty"`
	// RolloutTimeout caps an attempt's stepping (--rollout-timeout) as a
	// Go duration, "0s" for no cap; "" when not recorded.
	RolloutTimeout string `json:"rollout_timeout,omitempty"`
	// Environment is the desktops the batch runs on; nil when not
	// recorded (a batch.json older than it, or a library caller that
	// does not describe its desktops).
	Environment *Environment `json:"environment,omitempty"`
}

// Environment describes a batch's desktops: their backend and each of its
// knobs that changes what an attempt sees or how it is graded.
type Environment struct {
	Backend string `json:"backend"`
	// Knobs are the backend's settings by flag name (fake-success,
	// image, grader...), each as a string.
	Knobs map[string]string `json:"knobs,omitempty"`
}

// Sampling is the part of the policy's requests a batch must keep.
type Sampling struct {
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
	// Extra is the other request fields (top_k, chat_template_kwargs...)
	// as canonical JSON; "" when there are none.
	Extra string `json:"extra,omitempty"`
}

func (s Sampling) String() string {
	f := func(v *float64) string {
		if v == nil {
			return "server default"
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	out := fmt.Sprintf("temperature %s, top-p %s, max tokens %d", f(s.Temperature), f(s.TopP), s.MaxTokens)
	if s.Extra != "" {
		out += ", extra fields " + s.Extra
	}
	return out
}

// ReadBatch reads dir/batch.json; nil and no error when there is none.
func ReadBatch(dir string) (*Batch, error) {
	path := filepath.Join(dir, BatchFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read batch: %w", err)
	}
	var b Batch
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if b.Schema != "" && b.Schema != BatchVersion {
		return nil, fmt.Errorf("read %s: schema %q: this legato reads %q", path, b.Schema, BatchVersion)
	}
	return &b, nil
}

// WriteBatch writes b as the run's batch.json, atomically.
func (r *Run) WriteBatch(b *Batch) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return r.WriteFile(BatchFile, append(data, '\n'))
}
