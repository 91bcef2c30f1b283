package setup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// pyBool decodes a flag the way OSWorld's Python reads it: JSON true/false,
// or any other value by Python truthiness (task files say "shell": "true").
type pyBool bool

func (b *pyBool) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*b = false
	case bool:
		*b = pyBool(x)
	case string:
		*b = x != ""
	case float64:
		*b = x != 0
	default:
		return fmt.Errorf("want a boolean, got %s", data)
	}
	return nil
}

// command is OSWorld's "command": a list of arguments or one string.
type command struct {
	args   []string
	line   string
	isList bool
}

func (c *command) UnmarshalJSON(data []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("[")) {
		c.isList = true
		return json.Unmarshal(data, &c.args)
	}
	return json.Unmarshal(data, &c.line)
}

func (c command) empty() bool {
	if c.isList {
		return len(c.args) == 0
	}
	return strings.TrimSpace(c.line) == ""
}

func (c command) String() string {
	if c.isList {
		return strings.Join(c.args, " ")
	}
	return c.line
}

// map applies f to every string of the command.
func (c command) mapStrings(f func(string) string) command {
	out := command{isList: c.isList, line: f(c.line)}
	for _, a := range c.args {
		out.args = append(out.args, f(a))
	}
	return out
}

type fileToDownload struct {
	URL  string `json:"url"`
	Path string `json:"path"`
}

type downloadParams struct {
	Files []fileToDownload `json:"files"`
}

func (p downloadParams) validate() error {
	if len(p.Files) == 0 {
		return errors.New("no files")
	}
	for i, f := range p.Files {
		if f.URL == "" || f.Path == "" {
			return fmt.Errorf("file %d: want both url and path, got url %q path %q", i+1, f.URL, f.Path)
		}
	}
	return nil
}

type fileToUpload struct {
	LocalPath string `json:"local_path"`
	Path      string `json:"path"`
}

type uploadParams struct {
	Files []fileToUpload `json:"files"`
}

func (p uploadParams) validate() error {
	if len(p.Files) == 0 {
		return errors.New("no files")
	}
	for i, f := range p.Files {
		if f.LocalPath == "" || f.Path == "" {
			return fmt.Errorf("file %d: want both local_path and path, got %q and %q", i+1, f.LocalPath, f.Path)
		}
	}
	return nil
}

type launchParams struct {
	Command command `json:"command"`
	Shell   pyBool  `json:"shell"`
}

func (p launchParams) validate() error {
	if p.Command.empty() {
		return errors.New("empty command")
	}
	return nil
}

type pathParams struct {
	Path string `json:"path"`
}

func (p pathParams) validate() error {
	if p.Path == "" {
		return errors.New("empty path")
	}
	return nil
}

// until says when a polled execute step is done: any condition that holds.
type until struct {
	ReturnCode *int    `json:"returncode"`
	Stdout     *string `json:"stdout"`
	Stderr     *string `json:"stderr"`
}

func (u *until) set() bool {
	return u != nil && (u.ReturnCode != nil || u.Stdout != nil || u.Stderr != nil)
}

type executeParams struct {
	Command command `json:"command"`
	Shell   pyBool  `json:"shell"`
	// Stdout and Stderr name files in the controller's OutputDir that
	// receive the command's output, for the evaluator to read.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	Until  *until `json:"until"`
}

func (p executeParams) validate() error {
	if p.Command.empty() {
		return errors.New("empty command")
	}
	for _, name := range []string{p.Stdout, p.Stderr} {
		if name != "" && !filepath.IsLocal(filepath.FromSlash(name)) {
			return fmt.Errorf("output file %q must be a relative path inside the output directory", name)
		}
	}
	return nil
}

type verifyParams struct {
	Command       command  `json:"command"`
	Shell         pyBool   `json:"shell"`
	Verification  *verify  `json:"verification"`
	MaxWaitTime   *float64 `json:"max_wait_time"`
	CheckInterval *float64 `json:"check_interval"`
}

type verify struct {
	WindowExists   string `json:"window_exists"`
	CommandSuccess string `json:"command_success"`
}

func (p verifyParams) validate() error {
	if p.Command.empty() {
		return errors.New("empty command")
	}
	if p.MaxWaitTime != nil && *p.MaxWaitTime <= 0 {
		return fmt.Errorf("max_wait_time %v must be positive", *p.MaxWaitTime)
	}
	return nil
}

type windowParams struct {
	WindowName string `json:"window_name"`
	Strict     pyBool `json:"strict"`
	ByClass    pyBool `json:"by_class"`
}

func (p windowParams) validate() error {
	if p.WindowName == "" {
		return errors.New("empty window_name")
	}
	return nil
}

type sleepParams struct {
	Seconds *float64 `json:"seconds"`
}

func (p sleepParams) validate() error {
	if p.Seconds == nil || *p.Seconds < 0 {
		return errors.New("want seconds >= 0")
	}
	return nil
}

type openTabsParams struct {
	URLs []string `json:"urls_to_open"`
}

func (p openTabsParams) validate() error {
	if len(p.URLs) == 0 {
		return errors.New("no urls_to_open")
	}
	return nil
}

type closeTabsParams struct {
	URLs []string `json:"urls_to_close"`
}

func (p closeTabsParams) validate() error {
	if len(p.URLs) == 0 {
		return errors.New("no urls_to_close")
	}
	return nil
}

type historyItem struct {
	URL     string   `json:"url"`
	Title   string   `json:"title"`
	FromNow *float64 `json:"visit_time_from_now_in_seconds"`
}

type historyParams struct {
	History []historyItem `json:"history"`
}

func (p historyParams) validate() error {
	if len(p.History) == 0 {
		return errors.New("empty history")
	}
	for i, h := range p.History {
		if h.URL == "" || h.FromNow == nil {
			return fmt.Errorf("history item %d: want url and visit_time_from_now_in_seconds", i+1)
		}
	}
	return nil
}

// decodeStrict decodes OSWorld parameters into v, refusing unknown fields as
// OSWorld's keyword arguments do.
func decodeStrict(raw json.RawMessage, v interface{ validate() error }) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	if err := v.validate(); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}
