package rl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop"
)

// osworldDir is a copy of real OSWorld task files in OSWorld's layout.
const osworldDir = "testdata/osworld"

// examplesDir is where osworldDir keeps its task files.
var examplesDir = filepath.Join(osworldDir, "evaluation_examples", "examples")

// wantTask reads an OSWorld task file the plain way, through the json tags
// of Task, as an independent check of the loader's field-by-field reading.
func wantTask(t *testing.T, domain, id string) Task {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(examplesDir, domain, id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var task Task
	if err := json.Unmarshal(data, &task); err != nil {
		t.Fatal(err)
	}
	task.Domain, task.Raw = domain, data
	return task
}

// writeTasks writes a tasks file into a fresh directory and returns its
// path.
func writeTasks(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadTasksAllRealConfigs(t *testing.T) {
	var entries []map[string]string
	var want []Task
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		domain := filepath.Base(filepath.Dir(path))
		id := strings.TrimSuffix(d.Name(), ".json")
		entries = append(entries, map[string]string{"task_id": id, "domain": domain})
		want = append(want, wantTask(t, domain, id))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every task file of the copy, so a new one is covered without editing
	// this test; 44 today.
	if len(want) < 44 {
		t.Fatalf("found %d task files under %s, want at least 44", len(want), examplesDir)
	}
	data, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadTasks(writeTasks(t, "tasks.json", string(data)), LoadOptions{OSWorldDir: osworldDir})
	if err != nil {
		t.Fatalf("LoadTasks: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LoadTasks mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadTasksOSWorldIndex(t *testing.T) {
	index := filepath.Join(osworldDir, "evaluation_examples", "test_small.json")
	data, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	var byDomain map[string][]string
	if err := json.Unmarshal(data, &byDomain); err != nil {
		t.Fatal(err)
	}
	var want []string
	for domain, ids := range byDomain {
		for _, id := range ids {
			want = append(want, domain+"/"+id)
		}
	}

	// OSWorldDir left empty: the index sits in OSWorld's own layout.
	tasks, err := LoadTasks(index, LoadOptions{})
	if err != nil {
		t.Fatalf("LoadTasks: %v", err)
	}
	got := taskNames(tasks)
	if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("tasks mismatch (-want +got):\n%s", diff)
	}
	if len(got) != 39 {
		t.Errorf("got %d tasks, want the 39 of test_small.json", len(got))
	}
	// The first domain of the file, in the file's order.
	wantFirst := []string{
		"chrome/bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
		"chrome/7b6c7e24-c58a-49fc-a5bb-d57b80e5b4c3",
		"chrome/35253b65-1c19-4304-8aa4-6884b8218fc0",
		"chrome/a96b564e-dbe9-42c3-9ccf-b4498073438a",
	}
	if diff := cmp.Diff(wantFirst, got[:min(4, len(got))]); diff != "" {
		t.Errorf("order mismatch (-want +got):\n%s", diff)
	}
	for _, task := range tasks {
		if diff := cmp.Diff(wantTask(t, task.Domain, task.ID), task); diff != "" {
			t.Errorf("task %s mismatch (-want +got):\n%s", task.ID, diff)
		}
	}
}

func taskNames(tasks []Task) []string {
	var names []string
	for _, task := range tasks {
		names = append(names, task.Domain+"/"+task.ID)
	}
	return names
}

// Real task ids used below.
const (
	idOS     = "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2"
	idChrome = "3720f614-37fd-4d04-8a6b-76f54f8c222d"
	idVLC    = "59f21cfb-0120-4326-b255-a5b827b38967"
)

func TestParseTasksForms(t *testing.T) {
	inline := Task{
		ID:          "my-task",
		Domain:      "os",
		Instruction: "Turn the volume up.",
		Snapshot:    "os",
		Setup: []desktop.SetupStep{
			{Type: "execute", Parameters: json.RawMessage(`{"command":["true"]}`)},
			{Type: "sleep", Parameters: json.RawMessage(`{"seconds": 1}`)},
			{Type: "activate_window"},
		},
		Evaluator:   json.RawMessage(`{"func":["exact_match","check_include_exclude"],"conj":"and"}`),
		RelatedApps: []string{"os"},
		Raw:         json.RawMessage(`{"instruction":"Turn the volume up.","snapshot":"os","related_apps":["os"],"config":[{"type":"execute","parameters":{"command":["true"]}},{"type":"sleep","parameters":{"seconds": 1}},{"type":"activate_window"}],"evaluator":{"func":["exact_match","check_include_exclude"],"conj":"and"}}`),
	}
	inlineJSON := string(inline.Raw)

	tests := []struct {
		name  string
		input string
		dir   string
		want  []Task
	}{{
		name:  "by reference",
		input: `[{"task_id": "` + idVLC + `", "domain": "vlc"}, {"task_id": "` + idOS + `", "domain": "os"}]`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "vlc", idVLC), wantTask(t, "os", idOS)},
	}, {
		name:  "inline with domain",
		input: `[{"task_id": "my-task", "domain": "os", "config": ` + inlineJSON + `}]`,
		want:  []Task{inline},
	}, {
		name:  "inline domain from snapshot",
		input: `[{"task_id": "my-task", "config": ` + inlineJSON + `}]`,
		want:  []Task{inline},
	}, {
		name:  "inline id from config",
		input: `[{"domain": "os", "config": {"id": "my-task", "instruction": "i", "evaluator": {"func": "infeasible"}}}]`,
		want: []Task{{ID: "my-task", Domain: "os", Instruction: "i", Evaluator: json.RawMessage(`{"func": "infeasible"}`),
			Raw: json.RawMessage(`{"id": "my-task", "instruction": "i", "evaluator": {"func": "infeasible"}}`)}},
	}, {
		name:  "inline explicit domain beats snapshot",
		input: `[{"task_id": "v", "domain": "vlc", "config": {"snapshot": "base_setup", "instruction": "i", "evaluator": {"func": "f"}}}]`,
		want: []Task{{ID: "v", Domain: "vlc", Snapshot: "base_setup", Instruction: "i", Evaluator: json.RawMessage(`{"func": "f"}`),
			Raw: json.RawMessage(`{"snapshot": "base_setup", "instruction": "i", "evaluator": {"func": "f"}}`)}},
	}, {
		name:  "mixed",
		input: `[{"task_id": "` + idChrome + `", "domain": "chrome"}, {"task_id": "my-task", "config": ` + inlineJSON + `}]`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "chrome", idChrome), inline},
	}, {
		name:  "JSON Lines",
		input: "{\"task_id\": \"" + idOS + "\", \"domain\": \"os\"}\n\n{\"task_id\": \"my-task\", \"config\": " + inlineJSON + "}\n",
		dir:   osworldDir,
		want:  []Task{wantTask(t, "os", idOS), inline},
	}, {
		name:  "single entry",
		input: `{"task_id": "` + idOS + `", "domain": "os"}`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "os", idOS)},
	}, {
		name:  "index keeps file order",
		input: `{"vlc": ["` + idVLC + `"], "chrome": ["` + idChrome + `"], "os": ["` + idOS + `"]}`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "vlc", idVLC), wantTask(t, "chrome", idChrome), wantTask(t, "os", idOS)},
	}, {
		name:  "byte order mark",
		input: "\uFEFF" + `[{"task_id": "` + idOS + `", "domain": "os"}]`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "os", idOS)},
	}, {
		name:  "null config means by reference",
		input: `[{"task_id": "` + idOS + `", "domain": "os", "config": null}]`,
		dir:   osworldDir,
		want:  []Task{wantTask(t, "os", idOS)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTasks([]byte(tt.input), "tasks.json", LoadOptions{OSWorldDir: tt.dir})
			if err != nil {
				t.Fatalf("ParseTasks: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseTasks mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// taskFile is a minimal valid OSWorld task config with the given id.
func taskFile(id string) string {
	return `{"id": "` + id + `", "instruction": "do it", "evaluator": {"func": "exact_match"}}`
}

// tasksErrors returns the *TasksError values joined in err, and the
// messages of any others.
func tasksErrors(err error) ([]TasksError, []string) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var tes []TasksError
	var others []string
	for _, e := range errs {
		var te *TasksError
		if errors.As(e, &te) {
			tes = append(tes, *te)
		} else {
			others = append(others, e.Error())
		}
	}
	return tes, others
}

func TestParseTasksErrors(t *testing.T) {
	const file = "my-tasks.json"
	// An OSWorld checkout with one well-formed and a few broken task files.
	broken := t.TempDir()
	for path, content := range map[string]string{
		"evaluation_examples/examples/os/good.json":           taskFile("good"),
		"evaluation_examples/examples/os/renamed.json":        taskFile("original"),
		"evaluation_examples/examples/os/syntax.json":         "{\n  \"id\": \"syntax\",\n  oops\n}",
		"evaluation_examples/examples/os/no-instruction.json": `{"id": "no-instruction", "evaluator": {"func": "f"}}`,
		"evaluation_examples/examples/os/no-func.json":        `{"id": "no-func", "instruction": "i", "evaluator": {"result": {}}}`,
		"evaluation_examples/secret.json":                     taskFile("secret"),
	} {
		path = filepath.Join(broken, path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	brokenFile := func(name string) string {
		return filepath.Join(broken, "evaluation_examples", "examples", "os", name+".json")
	}
	missing := filepath.Join(examplesDir, "os", "0000.json")
	inline := func(id, config string) string {
		return `{"task_id": "` + id + `", "domain": "os", "config": ` + config + `}`
	}

	tests := []struct {
		name  string
		input string
		dir   string
		want  []TasksError // Err ignored
		// wantText must appear in the error: the hint telling what to do.
		wantText []string
	}{{
		name:     "invalid JSON",
		input:    "[\n  {\"task_id\": \"a\",}\n]",
		want:     []TasksError{{File: file, Line: 2, Column: 19}},
		wantText: []string{"my-tasks.json:2:19: invalid JSON"},
	}, {
		name:     "empty file",
		input:    " \n",
		want:     []TasksError{{File: file}},
		wantText: []string{"empty; want a JSON array"},
	}, {
		name:     "no tasks",
		input:    "[]",
		want:     []TasksError{{File: file}},
		wantText: []string{"no tasks"},
	}, {
		name:     "top level number",
		input:    "42",
		want:     []TasksError{{File: file}},
		wantText: []string{"top level is a number; want a JSON array of entries"},
	}, {
		name:     "top level task config",
		input:    taskFile("x"),
		want:     []TasksError{{File: file}},
		wantText: []string{"one OSWorld task config", `[{"task_id"`},
	}, {
		name:     "object of unknown shape",
		input:    `{"chrome": ["a"], "version": 2}`,
		want:     []TasksError{{File: file, Field: "version"}},
		wantText: []string{"version: is a number", "OSWorld index"},
	}, {
		name:     "entry not an object",
		input:    `["` + idOS + `"]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]"}},
		wantText: []string{"entry [0]: is a string; want an object"},
	}, {
		name:     "missing task file",
		input:    "[\n" + `{"task_id": "0000", "domain": "os"}` + "\n]",
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 2, Entry: "[0]", TaskID: "0000", Field: "task_id"}},
		wantText: []string{"no task file " + missing},
	}, {
		name:     "missing domain directory",
		input:    `[{"task_id": "` + idOS + `", "domain": "os_typo"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: idOS, Field: "domain"}},
		wantText: []string{"no directory " + filepath.Join(examplesDir, "os_typo")},
	}, {
		name: "duplicate id",
		input: "[\n" + `{"task_id": "` + idOS + `", "domain": "os"},` + "\n" + inline("x", taskFile("x")) + ",\n" +
			`{"task_id": "` + idOS + `", "domain": "os"}` + "\n]",
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 4, Entry: "[2]", TaskID: idOS, Field: "task_id"}},
		wantText: []string{"duplicate of entry [0] (line 2)"},
	}, {
		name:     "duplicate id across forms",
		input:    `[{"task_id": "x", "domain": "os", "config": ` + taskFile("x") + `}, {"task_id": "x", "domain": "os"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[1]", TaskID: "x", Field: "task_id"}},
		wantText: []string{"duplicate of entry [0]"},
	}, {
		name:     "inline without instruction",
		input:    `[` + inline("x", `{"evaluator": {"func": "f"}}`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.instruction"}},
		wantText: []string{"config.instruction: missing"},
	}, {
		name:     "inline blank instruction",
		input:    `[` + inline("x", `{"instruction": " ", "evaluator": {"func": "f"}}`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.instruction"}},
		wantText: []string{"empty"},
	}, {
		name:     "inline without evaluator",
		input:    `[` + inline("x", `{"instruction": "i"}`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.evaluator"}},
		wantText: []string{"config.evaluator: missing"},
	}, {
		name:     "inline evaluator without func",
		input:    `[` + inline("x", `{"instruction": "i", "evaluator": {"expected": {}}}`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.evaluator.func"}},
		wantText: []string{`names its metric in "func"`},
	}, {
		name:  "inline evaluator func of wrong type",
		input: `[` + inline("x", `{"instruction": "i", "evaluator": {"func": 3}}`) + `,` + inline("y", `{"instruction": "i", "evaluator": {"func": ["a", ""]}}`) + `]`,
		want: []TasksError{
			{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.evaluator.func"},
			{File: file, Line: 1, Entry: "[1]", TaskID: "y", Field: "config.evaluator.func[1]"},
		},
		wantText: []string{"is a number; want a metric name"},
	}, {
		name:     "inline config not an object",
		input:    `[` + inline("x", `"chrome"`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config"}},
		wantText: []string{"config: is a string; want an OSWorld task config"},
	}, {
		name:     "inline setup step without type",
		input:    `[` + inline("x", `{"instruction": "i", "evaluator": {"func": "f"}, "config": [{"type": "launch"}, {"parameters": {}}]}`) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.config[1].type"}},
		wantText: []string{"names its kind"},
	}, {
		name:     "inline id differs from task_id",
		input:    `[` + inline("x", taskFile("y")) + `]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.id"}},
		wantText: []string{`"y" differs from task_id "x"`},
	}, {
		name:     "inline without any id",
		input:    `[{"domain": "os", "config": {"instruction": "i", "evaluator": {"func": "f"}}}]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
		wantText: []string{`give the entry a "task_id"`},
	}, {
		name:     "inline without domain or snapshot",
		input:    `[{"task_id": "x", "config": {"instruction": "i", "evaluator": {"func": "f"}}}]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "domain"}},
		wantText: []string{`give the entry a "domain"`},
	}, {
		name:  "all problems of one entry",
		input: `[{"task_id": "x", "config": {}}]`,
		want: []TasksError{
			{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.instruction"},
			{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "config.evaluator"},
			{File: file, Line: 1, Entry: "[0]", TaskID: "x", Field: "domain"},
		},
	}, {
		name:     "task file id differs from its name",
		input:    `[{"task_id": "renamed", "domain": "os"}]`,
		dir:      broken,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "renamed", Path: brokenFile("renamed"), Field: "id"}},
		wantText: []string{"OSWorld task ids equal their file names"},
	}, {
		name:     "task file invalid JSON",
		input:    `[{"task_id": "syntax", "domain": "os"}]`,
		dir:      broken,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "syntax", Path: brokenFile("syntax")}},
		wantText: []string{"line 3, column 3: invalid JSON"},
	}, {
		name:  "task file problems",
		input: `[{"task_id": "no-instruction", "domain": "os"}, {"task_id": "no-func", "domain": "os"}, {"task_id": "good", "domain": "os"}]`,
		dir:   broken,
		want: []TasksError{
			{File: file, Line: 1, Entry: "[0]", TaskID: "no-instruction", Path: brokenFile("no-instruction"), Field: "instruction"},
			{File: file, Line: 1, Entry: "[1]", TaskID: "no-func", Path: brokenFile("no-func"), Field: "evaluator.func"},
		},
	}, {
		name:     "task id escapes the checkout",
		input:    `[{"task_id": "../../etc/passwd", "domain": "os"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
		wantText: []string{`"../../etc/passwd" is not a plain name`},
	}, {
		name:  "names that are not one path component",
		input: `[{"task_id": "../secret", "domain": "examples"}, {"task_id": "secret", "domain": ".."}, {"task_id": "/etc/passwd", "domain": "os"}, {"task_id": "a", "domain": "os/../.."}, {"task_id": "-rf", "domain": "os"}, {"task_id": ".", "domain": "os"}]`,
		dir:   broken,
		want: []TasksError{
			{File: file, Line: 1, Entry: "[0]", Field: "task_id"},
			{File: file, Line: 1, Entry: "[1]", TaskID: "secret", Field: "domain"},
			{File: file, Line: 1, Entry: "[2]", Field: "task_id"},
			{File: file, Line: 1, Entry: "[3]", TaskID: "a", Field: "domain"},
			{File: file, Line: 1, Entry: "[4]", Field: "task_id"},
			{File: file, Line: 1, Entry: "[5]", Field: "task_id"},
		},
	}, {
		name:     "inline names are checked too",
		input:    `[{"task_id": "a/b", "domain": "os", "config": ` + taskFile("a/b") + `}]`,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
		wantText: []string{"not a plain name"},
	}, {
		name:     "by reference without an OSWorld directory",
		input:    "[\n" + `{"task_id": "a", "domain": "os"}, {"task_id": "b", "domain": "os"}, {"task_id": "c", "domain": "os"}` + "\n]",
		want:     []TasksError{{File: file, Line: 2, Entry: "[0]", TaskID: "a"}},
		wantText: []string{"pass --osworld DIR", "(and 2 more entries by reference)"},
	}, {
		name:     "OSWorld directory without examples",
		input:    `[{"task_id": "a", "domain": "os"}]`,
		dir:      t.TempDir(),
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "a"}},
		wantText: []string{"has no evaluation_examples/examples"},
	}, {
		name:     "by reference without domain",
		input:    `[{"task_id": "a"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "a", Field: "domain"}},
		wantText: []string{`"task_id" and "domain"`},
	}, {
		name:     "by reference without task_id",
		input:    `[{"domain": "os"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
		wantText: []string{"task_id: missing"},
	}, {
		name:     "task_id not a string",
		input:    `[{"task_id": 7, "domain": "os"}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
		wantText: []string{"task_id: is a number; want a string"},
	}, {
		name:  "inline task_id not a string",
		input: `[{"task_id": 7, "domain": "os", "config": {"instruction": "i", "evaluator": {"func": "f"}}}]`,
		want:  []TasksError{{File: file, Line: 1, Entry: "[0]", Field: "task_id"}},
	}, {
		name:     "unknown entry field",
		input:    `[{"task_id": "a", "domain": "os", "group": 8}]`,
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 1, Entry: "[0]", TaskID: "a", Field: "group"}},
		wantText: []string{"unknown field"},
	}, {
		name:     "index with a non-string id",
		input:    "{\n  \"os\": [\n    \"" + idOS + "\",\n    {\"id\": 1}\n  ]\n}",
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 4, Entry: "os[1]", Field: "task_id"}},
		wantText: []string{"lists task ids as strings"},
	}, {
		name:  "index with a missing task",
		input: `{"os": ["` + idOS + `"], "chrome": ["0000"]}`,
		dir:   osworldDir,
		want:  []TasksError{{File: file, Line: 1, Entry: "chrome[0]", TaskID: "0000", Field: "task_id"}},
	}, {
		name:     "index with a repeated domain",
		input:    "{\n  \"os\": 5,\n  \"os\": [\"" + idOS + "\"]\n}",
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 2, Column: 9, Field: "os"}},
		wantText: []string{"my-tasks.json:2:9: os: is a number; an OSWorld index maps each domain to an array"},
	}, {
		name:     "JSON Lines with a bad line",
		input:    "{\"task_id\": \"" + idOS + "\", \"domain\": \"os\"}\n\n  {\"task_id\": oops}\n",
		dir:      osworldDir,
		want:     []TasksError{{File: file, Line: 3, Column: 15, Entry: "[1]"}},
		wantText: []string{"my-tasks.json:3:15: entry [1]: invalid JSON"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tasks, err := ParseTasks([]byte(tt.input), file, LoadOptions{OSWorldDir: tt.dir})
			if err == nil {
				t.Fatalf("ParseTasks returned %d tasks and no error", len(tasks))
			}
			if tasks != nil {
				t.Errorf("ParseTasks returned %d tasks with an error, want none", len(tasks))
			}
			got, others := tasksErrors(err)
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(TasksError{}, "Err")); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s\nerror: %v", diff, err)
			}
			if len(others) > 0 {
				t.Errorf("errors other than *TasksError: %q", others)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q:\n%v", s, err)
				}
			}
		})
	}
}

func TestParseTasksCapsErrors(t *testing.T) {
	var entries []string
	for i := range 30 {
		entries = append(entries, fmt.Sprintf(`{"task_id": "t%d"}`, i))
	}
	_, err := ParseTasks([]byte("["+strings.Join(entries, ",")+"]"), "tasks.json", LoadOptions{OSWorldDir: osworldDir})
	got, others := tasksErrors(err)
	if len(got) != maxTaskErrors {
		t.Errorf("got %d *TasksError, want %d", len(got), maxTaskErrors)
	}
	if want := []string{"tasks.json: 10 more problems not shown"}; !slices.Equal(want, others) {
		t.Errorf("other errors = %q, want %q", others, want)
	}
}

func TestLoadTasksMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.json")
	_, err := LoadTasks(path, LoadOptions{})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadTasks(%s) = %v, want an error naming the file that wraps fs.ErrNotExist", path, err)
	}
}

func TestLoadTasksFindsOSWorldDir(t *testing.T) {
	tests := []struct {
		name    string
		path    string // tasks file, relative to a fresh directory
		wantErr bool
	}{
		{"in evaluation_examples", "evaluation_examples/mine.json", false},
		{"elsewhere", "lists/mine.json", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			task := filepath.Join(root, "evaluation_examples", "examples", "os", "a.json")
			path := filepath.Join(root, tt.path)
			for _, f := range []struct{ path, content string }{
				{task, taskFile("a")},
				{path, `{"os": ["a"]}`},
			} {
				if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f.path, []byte(f.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tasks, err := LoadTasks(path, LoadOptions{})
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("LoadTasks error = %v, want error: %v", err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "--osworld") {
					t.Errorf("error does not tell to pass --osworld: %v", err)
				}
				return
			}
			if diff := cmp.Diff([]string{"os/a"}, taskNames(tasks)); diff != "" {
				t.Errorf("tasks mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTasksErrorString(t *testing.T) {
	base := errors.New("missing")
	tests := []struct {
		name string
		err  TasksError
		want string
	}{
		{"file", TasksError{File: "t.json", Err: base}, "t.json: missing"},
		{"position", TasksError{File: "t.json", Line: 3, Column: 7, Err: base}, "t.json:3:7: missing"},
		{"entry", TasksError{File: "t.json", Line: 3, Entry: "[2]", TaskID: "a", Field: "domain", Err: base},
			`t.json:3: entry [2] (task "a"): domain: missing`},
		{"task file", TasksError{File: "t.json", Line: 1, Entry: "os[0]", TaskID: "a", Path: "x/a.json", Field: "evaluator.func", Err: base},
			`t.json:1: entry os[0] (task "a"): x/a.json: evaluator.func: missing`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
			if !errors.Is(&tt.err, base) {
				t.Errorf("errors.Is(%v, base) = false, want true", &tt.err)
			}
		})
	}
}

// TestLineCounterIsLineCol: the counter gives lineCol's line for
// increasing offsets, ones past the end and repeated ones included.
func TestLineCounterIsLineCol(t *testing.T) {
	data := []byte("[\n {\"a\": 1},\n\n {\"b\": \"é\\n\"}, {\"c\": 3}\n]\n")
	c := lineCounter{data: data}
	for off := 0; off <= len(data)+2; off++ {
		want, _ := lineCol(data, off)
		for range 2 {
			if got := c.at(off); got != want {
				t.Fatalf("offset %d: line %d, want %d", off, got, want)
			}
		}
	}
}

// BenchmarkParseTasksOneLine parses n inline tasks written on one line, as
// json.Marshal writes them.
func BenchmarkParseTasksOneLine(b *testing.B) {
	for _, n := range []int{1000, 8000} {
		entries := make([]map[string]any, n)
		for i := range entries {
			id := fmt.Sprintf("t%05d", i)
			entries[i] = map[string]any{"task_id": id, "domain": "os", "config": map[string]any{
				"id": id, "instruction": "Click the red square.", "evaluator": map[string]any{"func": "fake_target"}}}
		}
		data, err := json.Marshal(entries)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := ParseTasks(data, "tasks.json", LoadOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
