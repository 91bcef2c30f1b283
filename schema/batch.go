package schema

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// AdvantageStd is the standard deviation that divides the batch's
	// group advantages (--advantage-std); "" in a batch.json written
	// before it was recorded, whose advantages were the population
	// std's (AdvantageStd.OrDefault).
	AdvantageStd AdvantageStd `json:"advantage_std,omitempty"`
}

// AdvantageStd says which standard deviation of a group's rewards divides
// their deviations from the mean in its GRPO advantages.
type AdvantageStd string

const (
	// PopulationStd divides the squared deviations by n: legato's
	// default, and what every batch before AdvantageStd was recorded
	// used.
	PopulationStd AdvantageStd = "population"
	// SampleStd divides them by n − 1 (Bessel's correction), as torch.std
	// does by default and slime and SkyRL compute their advantages: at
	// G = 4, population-std advantages are √(4/3) ≈ 1.155 times these.
	SampleStd AdvantageStd = "sample"
)

// AdvantageStds are the kinds ParseAdvantageStd accepts, in the order a
// usage text lists them.
var AdvantageStds = []AdvantageStd{PopulationStd, SampleStd}

// ParseAdvantageStd reads a kind as a flag or a file gives it.
func ParseAdvantageStd(s string) (AdvantageStd, error) {
	if k := AdvantageStd(s); k == PopulationStd || k == SampleStd {
		return k, nil
	}
	return "", fmt.Errorf("advantage std %q: want %s or %s", s, PopulationStd, SampleStd)
}

// OrDefault is k, or PopulationStd when k is "" (not recorded, not set).
func (k AdvantageStd) OrDefault() AdvantageStd {
	if k == "" {
		return PopulationStd
	}
	return k
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
	if err := b.checkAdvantageStd(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &b, nil
}

// checkAdvantageStd refuses a recorded kind this legato does not know:
// advantages computed with another std would be a silent change of scale.
func (b *Batch) checkAdvantageStd() error {
	if b.AdvantageStd == "" {
		return nil
	}
	_, err := ParseAdvantageStd(string(b.AdvantageStd))
	return err
}

// maxServiceManifest bounds the first line of a service's journal that
// RecordedAdvantageStd reads: the service's settings, a few hundred bytes.
const maxServiceManifest = 1 << 20

// RecordedAdvantageStd is the advantage std the batch in dir recorded:
// batch.json's, or in a service's run directory the one in the settings
// its journal (ServiceFile) starts with; PopulationStd when neither
// records one (a batch older than the setting, or no settings file).
func RecordedAdvantageStd(dir string) (AdvantageStd, error) {
	b, err := ReadBatch(dir)
	if err != nil {
		return "", err
	}
	if b == nil {
		if b, err = readServiceManifest(dir); err != nil {
			return "", err
		}
	}
	if b == nil {
		return PopulationStd, nil
	}
	return b.AdvantageStd.OrDefault(), nil
}

// readServiceManifest reads the settings a service's journal in dir starts
// with (a line {"op": "service", "manifest": BATCH, ...}, which legato/rl
// writes); nil when there is no journal or its first line is not whole
// yet (the service cuts such a line and writes it again).
func readServiceManifest(dir string) (*Batch, error) {
	path := filepath.Join(dir, ServiceFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the service's settings: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, maxServiceManifest)).ReadBytes('\n')
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var first struct {
		Op       string `json:"op"`
		Manifest *Batch `json:"manifest"`
	}
	if err := json.Unmarshal(line, &first); err != nil {
		return nil, fmt.Errorf("read %s: first line: %w", path, err)
	}
	if first.Op != "service" || first.Manifest == nil {
		return nil, fmt.Errorf("read %s: its first line is not the service's settings: not a service journal", path)
	}
	if err := first.Manifest.checkAdvantageStd(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return first.Manifest, nil
}

// WriteBatch writes b as the run's batch.json, atomically.
func (r *Run) WriteBatch(b *Batch) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return r.WriteFile(BatchFile, append(data, '\n'))
}
