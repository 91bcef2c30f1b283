package rl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"legato/rl/desktop"
)

// maxTaskErrors caps how many problems one load reports: enough to fix a
// file in one go, few enough to read.
const maxTaskErrors = 20

// LoadOptions configures LoadTasks and ParseTasks.
type LoadOptions struct {
	// OSWorldDir is the root of an OSWorld checkout, the directory that
	// holds evaluation_examples/. A task named by reference ({"task_id",
	// "domain"} entries and OSWorld index files) is read from
	// OSWorldDir/evaluation_examples/examples/<domain>/<task_id>.json.
	//
	// When empty, LoadTasks uses X if the tasks file is
	// X/evaluation_examples/<name>.json (where OSWorld keeps
	// test_all.json and test_small.json); otherwise, and always in
	// ParseTasks, only inline configs load and every task named by
	// reference is an error.
	OSWorldDir string
}

// TasksError is one problem with a tasks file or with one of its entries.
// LoadTasks and ParseTasks join every problem they find (up to 20) with
// errors.Join; errors.As finds the first.
type TasksError struct {
	// File is the tasks file, as the caller named it.
	File string
	// Line and Column locate the problem in File, from 1; zero when
	// unknown. Column is zero when only the entry's line is known.
	Line, Column int
	// Entry names the entry: "[3]" for the element at index 3 of an array
	// (or the fourth line of a JSONL file), "chrome[1]" for the second id
	// under "chrome" in an OSWorld index. Empty for the file as a whole.
	Entry string
	// TaskID is the entry's task id, when it has one.
	TaskID string
	// Path is the OSWorld task file the entry refers to, when the problem
	// is inside it.
	Path string
	// Field is the field at fault: "task_id", "domain", "config" and paths
	// below it ("config.evaluator.func") for entries, paths inside the task
	// file ("evaluator.func") when Path is set.
	Field string
	Err   error
}

func (e *TasksError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	if e.Entry != "" {
		b.WriteString(": entry " + e.Entry)
		if e.TaskID != "" {
			fmt.Fprintf(&b, " (task %q)", e.TaskID)
		}
	}
	if e.Path != "" {
		b.WriteString(": " + e.Path)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *TasksError) Unwrap() error { return e.Err }

// LoadTasks reads the tasks of a batch from the file at path. The file is
// one of:
//
//   - a JSON array of entries. {"task_id": ID, "domain": D} names OSWorld's
//     task D/ID under opts.OSWorldDir. {"task_id": ID, "config": {...}}
//     carries an OSWorld task config inline; its domain is the entry's
//     "domain" if given, else the config's "snapshot" (OSWorld's domain is
//     the examples subdirectory, which an inline config does not have, so
//     give "domain" when they differ). task_id may be left out when the
//     config has an "id"; when both are given they must be equal. Both
//     kinds may be mixed.
//   - JSON Lines: one such entry per line.
//   - an OSWorld index such as test_small.json, {"<domain>": ["<task_id>",
//     ...], ...}, resolved like {"task_id", "domain"} entries.
//
// Tasks come back in file order. Every config must have a non-empty
// "instruction" and an "evaluator" with a "func"; a task file's "id" must
// equal its file name; ids are unique; ids and domains are plain names
// (letters, digits, '.', '_', '-'), so no entry reaches outside
// OSWorldDir. On any problem LoadTasks returns no tasks and an error that
// joins a *TasksError per problem.
func LoadTasks(path string, opts LoadOptions) ([]Task, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tasks file: %w", err)
	}
	if opts.OSWorldDir == "" {
		opts.OSWorldDir = osworldRootOf(path)
	}
	return ParseTasks(data, path, opts)
}

// ParseTasks is LoadTasks for a tasks file already in memory; name stands
// for the file in errors. Tasks named by reference are still read from
// opts.OSWorldDir, which ParseTasks never infers.
func ParseTasks(data []byte, name string, opts LoadOptions) ([]Task, error) {
	p := &tasksParser{file: name, dir: opts.OSWorldDir, seen: map[string]entryLoc{}}
	p.parse(bytes.TrimPrefix(data, []byte("\uFEFF")))
	return p.finish()
}

// osworldRootOf returns X when path is X/evaluation_examples/<file>, the
// place of OSWorld's own index files, and "" otherwise.
func osworldRootOf(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	dir := filepath.Dir(abs)
	if filepath.Base(dir) != "evaluation_examples" {
		return ""
	}
	return filepath.Dir(dir)
}

// entryLoc says where an entry is, for errors.
type entryLoc struct {
	name string // "[3]", "chrome[1]"
	line int
}

// tasksParser holds the state of one ParseTasks call.
type tasksParser struct {
	file  string
	dir   string // OSWorldDir
	tasks []Task
	seen  map[string]entryLoc // task id → its first entry

	errs    []error
	dropped int

	// Entries by reference when there is no usable OSWorld directory get
	// one error between them, not one each.
	dirErr     *TasksError
	dirChecked bool
	dirSkipped int
}

func (p *tasksParser) add(e *TasksError) {
	e.File = p.file
	if len(p.errs) >= maxTaskErrors {
		p.dropped++
		return
	}
	p.errs = append(p.errs, e)
}

func (p *tasksParser) finish() ([]Task, error) {
	// dirSkipped counts the entry that dirErr names too.
	if p.dirErr != nil && p.dirSkipped > 1 {
		p.dirErr.Err = fmt.Errorf("%w (and %d more entries by reference)", p.dirErr.Err, p.dirSkipped-1)
	}
	if len(p.errs) == 0 && len(p.tasks) == 0 {
		p.add(&TasksError{Err: errors.New(`no tasks; list entries such as {"task_id": "<id>", "domain": "<domain>"}`)})
	}
	if len(p.errs) == 0 {
		return p.tasks, nil
	}
	if p.dropped > 0 {
		p.errs = append(p.errs, fmt.Errorf("%s: %d more problems not shown", p.file, p.dropped))
	}
	return nil, errors.Join(p.errs...)
}

func (p *tasksParser) parse(data []byte) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		p.add(&TasksError{Err: errors.New(`empty; want a JSON array of entries such as {"task_id": "<id>", "domain": "<domain>"}`)})
		return
	}
	if !json.Valid(data) {
		if first := firstLine(data); len(first) > 0 && first[0] == '{' && json.Valid(first) {
			p.parseJSONL(data)
			return
		}
		var v json.RawMessage
		err := json.Unmarshal(data, &v)
		p.add(syntaxError(data, err))
		return
	}
	switch jsonKind(trimmed) {
	case "array":
		p.parseArray(data)
	case "object":
		p.parseObject(data)
	default:
		p.add(&TasksError{Err: fmt.Errorf(`top level is %s; want a JSON array of entries, JSON Lines, or an OSWorld index {"<domain>": ["<task_id>", ...]}`, describe(trimmed))})
	}
}

// syntaxError locates a JSON syntax error in data.
func syntaxError(data []byte, err error) *TasksError {
	e := &TasksError{Err: fmt.Errorf("invalid JSON: %w", err)}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		// Offset counts the offending byte.
		e.Line, e.Column = lineCol(data, int(se.Offset)-1)
	}
	return e
}

// lineCol converts a byte offset into a 1-based line and column (in
// characters).
func lineCol(data []byte, off int) (line, col int) {
	off = max(0, min(off, len(data)))
	before := data[:off]
	line = 1 + bytes.Count(before, []byte("\n"))
	start := bytes.LastIndexByte(before, '\n') + 1
	return line, 1 + utf8.RuneCount(before[start:])
}

// lineCounter gives the 1-based lines of increasing offsets in data,
// counting each byte once: lineCol from the start of the file for every
// element of a tasks file made loading quadratic (13,750 tasks on one 4.8
// MB line took over two minutes).
type lineCounter struct {
	data []byte
	off  int // data[:off] is counted
	line int // lines ended in data[:off]
}

func (c *lineCounter) at(off int) int {
	off = max(c.off, min(off, len(c.data)))
	c.line += bytes.Count(c.data[c.off:off], []byte("\n"))
	c.off = off
	return 1 + c.line
}

// firstLine returns the first line of data that is not blank, trimmed.
func firstLine(data []byte) []byte {
	for line := range bytes.Lines(data) {
		if t := bytes.TrimSpace(line); len(t) > 0 {
			return t
		}
	}
	return nil
}

// skipSep returns the offset of the first byte at or after off that is
// neither white space nor a separator (',' or ':'): the start of the next
// value.
func skipSep(data []byte, off int) int {
	for off < len(data) {
		switch data[off] {
		case ' ', '\t', '\r', '\n', ',', ':':
			off++
		default:
			return off
		}
	}
	return off
}

// parseArray reads a valid JSON array of entries.
func (p *tasksParser) parseArray(data []byte) {
	p.eachElement(data, skipSep(data, 0), func(i, line int, raw json.RawMessage) {
		p.entry(raw, entryLoc{name: fmt.Sprintf("[%d]", i), line: line})
	})
}

// parseJSONL reads one entry per non-blank line.
func (p *tasksParser) parseJSONL(data []byte) {
	n, i := 0, 0
	for line := range bytes.Lines(data) {
		n++
		t := bytes.TrimSpace(line)
		if len(t) == 0 {
			continue
		}
		loc := entryLoc{name: fmt.Sprintf("[%d]", i), line: n}
		i++
		if !json.Valid(t) {
			var v json.RawMessage
			e := syntaxError(t, json.Unmarshal(t, &v))
			e.Entry, e.Line = loc.name, n
			e.Column += len(line) - len(bytes.TrimLeft(line, " \t\r"))
			p.add(e)
			continue
		}
		p.entry(t, loc)
	}
}

// parseObject reads a valid JSON object: an OSWorld index, or a single
// entry.
func (p *tasksParser) parseObject(data []byte) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		p.add(syntaxError(data, err))
		return
	}
	_, hasID := fields["task_id"]
	_, hasConfig := fields["config"]
	var notArray []string
	for k, v := range fields {
		if jsonKind(v) != "array" {
			notArray = append(notArray, k)
		}
	}
	slices.Sort(notArray)
	switch {
	case len(notArray) == 0:
		p.parseIndex(data)
	case hasID || hasConfig:
		line, _ := lineCol(data, skipSep(data, 0))
		p.entry(data, entryLoc{name: "[0]", line: line})
	case fields["instruction"] != nil || fields["evaluator"] != nil:
		p.add(&TasksError{Err: errors.New(`top level is one OSWorld task config; list tasks instead: [{"task_id": "<id>", "domain": "<domain>"}] or [{"domain": "<domain>", "config": {...}}]`)})
	default:
		p.add(&TasksError{Field: notArray[0], Err: fmt.Errorf(`is %s, so the file is neither an OSWorld index {"<domain>": ["<task_id>", ...]} nor an entry {"task_id", "domain"}; want a JSON array of entries`, describe(fields[notArray[0]]))})
	}
}

// parseIndex reads an OSWorld index, {"<domain>": ["<task_id>", ...]},
// keeping the file's order of domains.
func (p *tasksParser) parseIndex(data []byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // '{'
		p.add(syntaxError(data, err))
		return
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			p.add(syntaxError(data, err))
			return
		}
		domain, _ := tok.(string)
		start := skipSep(data, int(dec.InputOffset()))
		var ids json.RawMessage
		if err := dec.Decode(&ids); err != nil {
			p.add(syntaxError(data, err))
			return
		}
		if k := jsonKind(ids); k != "array" {
			// Only a repeated key gets here: parseObject saw the last
			// value, an array.
			line, col := lineCol(data, start)
			p.add(&TasksError{Line: line, Column: col, Field: domain, Err: fmt.Errorf("is %s; an OSWorld index maps each domain to an array of task ids", describe(ids))})
			continue
		}
		label := domain
		if !safeName(domain) {
			label = strconv.Quote(domain)
		}
		p.eachElement(data, start, func(i, line int, raw json.RawMessage) {
			loc := entryLoc{name: fmt.Sprintf("%s[%d]", label, i), line: line}
			var id string
			if jsonKind(raw) != "string" || json.Unmarshal(raw, &id) != nil {
				p.entryErr(loc, "", "task_id", fmt.Errorf("is %s; an OSWorld index lists task ids as strings", describe(raw)))
				return
			}
			p.reference(loc, domain, id)
		})
	}
}

// eachElement calls fn with each element of the valid JSON array at
// data[start:] and the line in data where the element starts.
func (p *tasksParser) eachElement(data []byte, start int, fn func(i, line int, raw json.RawMessage)) {
	dec := json.NewDecoder(bytes.NewReader(data[start:]))
	if _, err := dec.Token(); err != nil { // '['
		p.add(syntaxError(data[start:], err))
		return
	}
	lines := lineCounter{data: data}
	for i := 0; dec.More(); i++ {
		line := lines.at(skipSep(data, start+int(dec.InputOffset())))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			p.add(syntaxError(data[start:], err))
			return
		}
		fn(i, line, raw)
	}
}

func (p *tasksParser) entryErr(loc entryLoc, id, field string, err error) {
	p.add(&TasksError{Line: loc.line, Entry: loc.name, TaskID: id, Field: field, Err: err})
}

// entry reads one {"task_id", "domain"} or {"task_id", "config"} entry.
func (p *tasksParser) entry(raw json.RawMessage, loc entryLoc) {
	if k := jsonKind(raw); k != "object" {
		p.entryErr(loc, "", "", fmt.Errorf(`is %s; want an object such as {"task_id": "<id>", "domain": "<domain>"} or {"task_id": "<id>", "config": {...}}`, describe(raw)))
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		p.entryErr(loc, "", "", fmt.Errorf("invalid JSON: %w", err))
		return
	}
	bad := false
	fail := func(id, field string, err error) {
		bad = true
		p.entryErr(loc, id, field, err)
	}
	id, _, err := stringField(fields, "task_id")
	idBad := err != nil
	if idBad {
		fail("", "task_id", err)
	}
	domain, _, err := stringField(fields, "domain")
	if err != nil {
		fail(id, "domain", err)
	}
	for _, k := range unknownEntryFields(fields) {
		fail(id, k, errUnknownEntryField)
	}
	config, inline := fields["config"]
	if inline && jsonKind(config) == "null" {
		inline = false
	}
	if !inline {
		if bad {
			return
		}
		if id == "" {
			p.entryErr(loc, "", "task_id", errors.New(`missing; name the OSWorld task with "task_id" and "domain", or give its "config" inline`))
			bad = true
		}
		if domain == "" {
			p.entryErr(loc, id, "domain", errors.New(`missing; an entry without an inline "config" names the OSWorld task by "task_id" and "domain" (its examples subdirectory, e.g. "chrome")`))
			bad = true
		}
		if !bad {
			p.reference(loc, domain, id)
		}
		return
	}

	cfg, problems := parseTaskConfig(config, "config.")
	for _, pr := range problems {
		fail(firstNonEmpty(id, cfg.id), pr.field, pr.err)
	}
	switch {
	case idBad:
	case id == "" && cfg.id == "":
		fail("", "task_id", errors.New(`missing; give the entry a "task_id" (or its config an "id")`))
	case id == "":
		id = cfg.id
	case cfg.id != "" && cfg.id != id:
		fail(id, "config.id", fmt.Errorf("%q differs from task_id %q; make them equal or drop one", cfg.id, id))
	}
	if domain == "" {
		domain = cfg.task.Snapshot
		if domain == "" {
			fail(id, "domain", errors.New(`missing; give the entry a "domain" (OSWorld's examples subdirectory, e.g. "chrome") or its config a "snapshot"`))
		}
	}
	if !p.checkNames(loc, domain, id) || bad {
		return
	}
	t := cfg.task
	t.ID, t.Domain, t.Raw = id, domain, cfg.raw
	p.tasks = append(p.tasks, t)
}

// errUnknownEntryField refuses a field a tasks-file entry does not have:
// a tasks file and a service's submission share the rule.
var errUnknownEntryField = errors.New(`unknown field; an entry has "task_id", "domain" and, for an inline task, "config"`)

// unknownEntryFields returns the fields of a tasks-file entry other than
// "task_id", "domain" and "config", sorted.
func unknownEntryFields(fields map[string]json.RawMessage) []string {
	var unknown []string
	for k := range fields {
		if k != "task_id" && k != "domain" && k != "config" {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// checkNames checks that id and domain are plain names and that id is not
// taken, and reports whether they pass.
func (p *tasksParser) checkNames(loc entryLoc, domain, id string) bool {
	ok := true
	if id != "" && !safeName(id) {
		p.entryErr(loc, "", "task_id", fmt.Errorf("%q is not a plain name; use letters, digits, '.', '_' and '-' (OSWorld ids are UUIDs)", id))
		ok = false
		id = ""
	}
	if domain != "" && !safeName(domain) {
		p.entryErr(loc, id, "domain", fmt.Errorf("%q is not a plain name; use letters, digits, '.', '_' and '-' (OSWorld domains are names such as chrome or multi_apps)", domain))
		ok = false
	}
	if id == "" {
		return false
	}
	if first, dup := p.seen[id]; dup {
		p.entryErr(loc, id, "task_id", fmt.Errorf("duplicate of entry %s (line %d); list each task once (the group size sets attempts per task)", first.name, first.line))
		return false
	}
	p.seen[id] = loc
	return ok
}

// reference loads the OSWorld task domain/id from the OSWorld directory.
func (p *tasksParser) reference(loc entryLoc, domain, id string) {
	if !p.checkNames(loc, domain, id) {
		return
	}
	if !p.osworldReady(loc, id) {
		p.dirSkipped++
		return
	}
	examples := filepath.Join(p.dir, "evaluation_examples", "examples")
	path := filepath.Join(examples, domain, id+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		switch {
		case !errors.Is(err, fs.ErrNotExist):
			p.entryErr(loc, id, "", fmt.Errorf("read task file: %w", err))
		case !isDir(filepath.Join(examples, domain)):
			p.entryErr(loc, id, "domain", fmt.Errorf("no directory %s; the domain is a subdirectory of evaluation_examples/examples (chrome, os, ...)", filepath.Join(examples, domain)))
		default:
			p.entryErr(loc, id, "task_id", fmt.Errorf("no task file %s; check the task id and its domain", path))
		}
		return
	}
	fileErr := func(field string, err error) {
		p.add(&TasksError{Line: loc.line, Entry: loc.name, TaskID: id, Path: path, Field: field, Err: err})
	}
	if !json.Valid(data) {
		var v json.RawMessage
		se := syntaxError(data, json.Unmarshal(data, &v))
		fileErr("", fmt.Errorf("line %d, column %d: %w", se.Line, se.Column, se.Err))
		return
	}
	cfg, problems := parseTaskConfig(data, "")
	for _, pr := range problems {
		fileErr(pr.field, pr.err)
	}
	if cfg.id != "" && cfg.id != id {
		fileErr("id", fmt.Errorf("%q differs from the file name's task id %q; OSWorld task ids equal their file names", cfg.id, id))
		return
	}
	if len(problems) > 0 {
		return
	}
	t := cfg.task
	t.ID, t.Domain, t.Raw = id, domain, data
	p.tasks = append(p.tasks, t)
}

// osworldReady reports whether tasks can be read by reference, reporting
// once, at the first such entry, why not.
func (p *tasksParser) osworldReady(loc entryLoc, id string) bool {
	if !p.dirChecked {
		p.dirChecked = true
		var err error
		switch {
		case p.dir == "":
			err = errors.New(`entries that name a task by "task_id" and "domain" are read from an OSWorld checkout; pass --osworld DIR (LoadOptions.OSWorldDir), or give the task's "config" inline`)
		case !isDir(filepath.Join(p.dir, "evaluation_examples", "examples")):
			err = fmt.Errorf("OSWorld directory %s has no evaluation_examples/examples; pass the root of an OSWorld checkout as --osworld DIR (LoadOptions.OSWorldDir)", p.dir)
		}
		if err != nil {
			p.dirErr = &TasksError{Line: loc.line, Entry: loc.name, TaskID: id, Err: err}
			p.add(p.dirErr)
		}
		return err == nil
	}
	return p.dirErr == nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// safeName reports whether s can name a task or a domain: one path
// component, no separators, not "." or "..", nothing a shell or a flag
// parser would read specially.
func safeName(s string) bool {
	if s == "" || len(s) > 200 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// taskConfig is an OSWorld task config as read, before it gets an id and a
// domain from its entry.
type taskConfig struct {
	id   string
	task Task
	raw  json.RawMessage
}

type fieldProblem struct {
	field string
	err   error
}

// parseTaskConfig reads an OSWorld task config. prefix is put before the
// field names in problems ("config." for an inline config).
func parseTaskConfig(raw json.RawMessage, prefix string) (taskConfig, []fieldProblem) {
	var problems []fieldProblem
	fail := func(field string, err error) {
		problems = append(problems, fieldProblem{prefix + field, err})
	}
	cfg := taskConfig{raw: raw}
	if k := jsonKind(raw); k != "object" {
		field := strings.TrimSuffix(prefix, ".")
		problems = append(problems, fieldProblem{field, fmt.Errorf(`is %s; want an OSWorld task config object with "instruction" and "evaluator"`, describe(raw))})
		return cfg, problems
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		fail("", fmt.Errorf("invalid JSON: %w", err))
		return cfg, problems
	}
	var err error
	if cfg.id, _, err = stringField(fields, "id"); err != nil {
		fail("id", err)
	}
	instruction, ok, err := stringField(fields, "instruction")
	switch {
	case err != nil:
		fail("instruction", err)
	case !ok:
		fail("instruction", errors.New("missing; the task needs the instruction given to the agent"))
	case strings.TrimSpace(instruction) == "":
		fail("instruction", errors.New("empty; the task needs the instruction given to the agent"))
	}
	cfg.task.Instruction = instruction
	if cfg.task.Snapshot, _, err = stringField(fields, "snapshot"); err != nil {
		fail("snapshot", err)
	}
	cfg.task.Setup, err = parseSetup(fields["config"], func(field string, err error) { fail("config"+field, err) })
	if err != nil {
		fail("config", err)
	}
	if apps := fields["related_apps"]; apps != nil && jsonKind(apps) != "null" {
		if json.Unmarshal(apps, &cfg.task.RelatedApps) != nil {
			fail("related_apps", errors.New("want an array of application names (strings)"))
		}
	}
	ev, ok := fields["evaluator"]
	if !ok || jsonKind(ev) == "null" {
		fail("evaluator", errors.New(`missing; the task needs an OSWorld evaluator such as {"func": "exact_match", ...} to be graded`))
	} else {
		cfg.task.Evaluator = ev
		if pr := checkEvaluator(ev); pr != nil {
			fail("evaluator"+pr.field, pr.err)
		}
	}
	return cfg, problems
}

// parseSetup reads the "config" list of setup steps. It returns an error
// for the list as a whole and reports problems with single steps to fail.
func parseSetup(raw json.RawMessage, fail func(field string, err error)) ([]desktop.SetupStep, error) {
	if raw == nil || jsonKind(raw) == "null" {
		return nil, nil
	}
	if k := jsonKind(raw); k != "array" {
		return nil, fmt.Errorf(`is %s; want a list of setup steps such as {"type": "launch", "parameters": {...}}`, describe(raw))
	}
	var steps []json.RawMessage
	if err := json.Unmarshal(raw, &steps); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	out := make([]desktop.SetupStep, 0, len(steps))
	for i, s := range steps {
		at := fmt.Sprintf("[%d]", i)
		if k := jsonKind(s); k != "object" {
			fail(at, fmt.Errorf(`is %s; want a setup step such as {"type": "launch", "parameters": {...}}`, describe(s)))
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(s, &fields); err != nil {
			fail(at, fmt.Errorf("invalid JSON: %w", err))
			continue
		}
		typ, ok, err := stringField(fields, "type")
		switch {
		case err != nil:
			fail(at+".type", err)
			continue
		case !ok || typ == "":
			fail(at+".type", errors.New(`missing; every setup step names its kind ("download", "launch", "execute", ...)`))
			continue
		}
		step := desktop.SetupStep{Type: typ}
		if params := fields["parameters"]; params != nil && jsonKind(params) != "null" {
			step.Parameters = params
		}
		out = append(out, step)
	}
	return out, nil
}

// checkEvaluator checks that an evaluator names its metric: "func" is a
// non-empty string or a non-empty list of them (metrics joined by "conj").
func checkEvaluator(ev json.RawMessage) *fieldProblem {
	if k := jsonKind(ev); k != "object" {
		return &fieldProblem{"", fmt.Errorf(`is %s; want an object such as {"func": "exact_match", ...}`, describe(ev))}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(ev, &fields); err != nil {
		return &fieldProblem{"", fmt.Errorf("invalid JSON: %w", err)}
	}
	fn, ok := fields["func"]
	if !ok || jsonKind(fn) == "null" {
		return &fieldProblem{".func", errors.New(`missing; the evaluator names its metric in "func" (e.g. "exact_match", or "infeasible")`)}
	}
	var one string
	var many []string
	switch {
	case json.Unmarshal(fn, &one) == nil:
		if one == "" {
			return &fieldProblem{".func", errors.New("empty; name the metric (e.g. \"exact_match\")")}
		}
	case json.Unmarshal(fn, &many) == nil:
		if len(many) == 0 {
			return &fieldProblem{".func", errors.New("empty list; name at least one metric")}
		}
		for i, m := range many {
			if m == "" {
				return &fieldProblem{fmt.Sprintf(".func[%d]", i), errors.New("empty; name the metric")}
			}
		}
	default:
		return &fieldProblem{".func", fmt.Errorf("is %s; want a metric name or a list of them", describe(fn))}
	}
	return nil
}

// stringField returns the string field key of an object: "" and false when
// it is missing or null, an error when it is not a string.
func stringField(fields map[string]json.RawMessage, key string) (string, bool, error) {
	raw, ok := fields[key]
	if !ok || jsonKind(raw) == "null" {
		return "", false, nil
	}
	var s string
	if jsonKind(raw) != "string" || json.Unmarshal(raw, &s) != nil {
		return "", false, fmt.Errorf("is %s; want a string", describe(raw))
	}
	return s, true, nil
}

// jsonKind names the kind of a valid JSON value.
func jsonKind(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// describe names the kind of a valid JSON value with its article, for
// messages.
func describe(raw []byte) string {
	switch k := jsonKind(raw); k {
	case "object", "array":
		return "an " + k
	case "null", "nothing":
		return k
	default:
		return "a " + k
	}
}
