package grade

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

// loadTask reads a real OSWorld task copied into testdata/tasks.
func loadTask(t testing.TB, id string) desktop.Task {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "tasks", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var task desktop.Task
	if err := json.Unmarshal(data, &task); err != nil {
		t.Fatal(err)
	}
	return task
}

// shape is what a parsed evaluator looks like, without the raw JSON.
type shape struct {
	Infeasible bool
	List       bool
	Conj       string
	Funcs      []string
	Results    []string
	Expected   []string // "" for none
	Options    []string
	PostConfig []string
}

func shapeOf(ev *Evaluator) shape {
	s := shape{Infeasible: ev.Infeasible, List: ev.List, Conj: ev.Conj}
	for _, m := range ev.Metrics {
		s.Funcs = append(s.Funcs, m.Func)
		s.Results = append(s.Results, m.Result.Type)
		exp := ""
		if m.Expected != nil {
			exp = m.Expected.Type
		}
		s.Expected = append(s.Expected, exp)
		s.Options = append(s.Options, string(m.Options))
	}
	for _, p := range ev.PostConfig {
		s.PostConfig = append(s.PostConfig, p.Type)
	}
	return s
}

func TestParseEvaluatorRealTasks(t *testing.T) {
	tests := []struct {
		task string
		want shape
	}{
		{"3720f614-37fd-4d04-8a6b-76f54f8c222d", shape{Infeasible: true, Conj: "and"}},
		{"28cc3b7e-b194-4bc9-8353-d04c0f4d56d2", shape{
			Conj: "and", Funcs: []string{"exact_match"}, Results: []string{"vm_command_line"},
			Expected: []string{"rule"}, Options: []string{"{}"},
		}},
		{"3680a5ee-6870-426a-a997-eba929a0d25c", shape{
			List: true, Conj: "and", Funcs: []string{"check_include_exclude", "compare_csv"},
			Results: []string{"vm_command_line", "vm_file"}, Expected: []string{"rule", "cloud_file"},
			Options: []string{"{}", "{}"},
		}},
		{"0ed39f63-6049-43d4-ba4d-5fa2fe04a951", shape{
			Conj: "and", Funcs: []string{"compare_text_file"}, Results: []string{"vm_file"},
			Expected: []string{"cloud_file"}, Options: []string{"{}"},
			PostConfig: []string{"activate_window", "sleep", "execute", "sleep"},
		}},
		{"74d5859f-ed66-4d3e-aa0e-93d7a592ce41", shape{
			List: true, Conj: "and",
			Funcs:    []string{"check_json", "diff_text_file", "diff_text_file", "diff_text_file", "diff_text_file"},
			Results:  []string{"vm_file", "vm_file", "vm_file", "vm_file", "vm_file"},
			Expected: []string{"rule", "cloud_file", "cloud_file", "cloud_file", "cloud_file"},
			Options:  []string{"{}", "{}", "{}", "{}", "{}"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.task, func(t *testing.T) {
			ev, err := ParseEvaluator(loadTask(t, tt.task).Evaluator)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, shapeOf(ev)); diff != "" {
				t.Errorf("ParseEvaluator (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseEvaluatorForms(t *testing.T) {
	tests := []struct {
		name string
		json string
		want shape
	}{
		{"options single", `{"func":"m","result":{"type":"rule","rules":1},"options":{"ignore_case":true}}`,
			shape{Conj: "and", Funcs: []string{"m"}, Results: []string{"rule"}, Expected: []string{""}, Options: []string{`{"ignore_case":true}`}}},
		{"empty expected object means none", `{"func":"m","result":{"type":"rule"},"expected":{}}`,
			shape{Conj: "and", Funcs: []string{"m"}, Results: []string{"rule"}, Expected: []string{""}, Options: []string{"{}"}}},
		{"or list with null entries", `{"func":["a","b"],"conj":"or","result":[{"type":"x"},{"type":"y"}],"expected":[null,{"type":"rule"}],"options":[null,{"k":1}]}`,
			shape{List: true, Conj: "or", Funcs: []string{"a", "b"}, Results: []string{"x", "y"}, Expected: []string{"", "rule"}, Options: []string{"{}", `{"k":1}`}}},
		{"list of one", `{"func":["a"],"result":[{"type":"x"}]}`,
			shape{List: true, Conj: "and", Funcs: []string{"a"}, Results: []string{"x"}, Expected: []string{""}, Options: []string{"{}"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := ParseEvaluator(json.RawMessage(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, shapeOf(ev)); diff != "" {
				t.Errorf("ParseEvaluator (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseEvaluatorRefuses(t *testing.T) {
	tests := []struct {
		name, json, wantErr string
	}{
		{"no evaluator", ``, "no evaluator"},
		{"null", `null`, "no evaluator"},
		{"func missing", `{"result":{"type":"x"}}`, "func"},
		{"func number", `{"func":3}`, "func"},
		{"empty list", `{"func":[]}`, "empty list"},
		{"bad conj", `{"func":["a"],"conj":"xor","result":[{"type":"x"}]}`, `conj "xor"`},
		{"result missing", `{"func":"a"}`, "result: missing"},
		{"result list for one metric", `{"func":"a","result":[{"type":"x"}]}`, "want a getter object"},
		{"result object for a list", `{"func":["a"],"result":{"type":"x"}}`, "must be a list too"},
		{"lengths differ", `{"func":["a","b"],"result":[{"type":"x"}]}`, "1 entries for 2 metrics"},
		{"null result in list", `{"func":["a","b"],"result":[{"type":"x"},null]}`, "result[1]: missing"},
		{"getter without type", `{"func":"a","result":{"path":"/x"}}`, "no type"},
		{"options list for one metric", `{"func":"a","result":{"type":"x"},"options":[{}]}`, "options: want an object"},
		{"options of wrong length", `{"func":["a"],"result":[{"type":"x"}],"options":[{},{}]}`, "2 entries for 1 metrics"},
		{"postconfig step without type", `{"func":"infeasible","postconfig":[{"parameters":{}}]}`, "postconfig[0]: no type"},
		{"not UTF-8", "{\"func\":\"a\",\"result\":{\"type\":\"rule\",\"rules\":\"\xff\"}}", "not UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseEvaluator(json.RawMessage(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseEvaluator(%s) error = %v, want one containing %q", tt.json, err, tt.wantErr)
			}
		})
	}
}
