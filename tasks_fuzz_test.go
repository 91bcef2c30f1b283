package rl

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzParseTasks checks that no tasks file makes ParseTasks panic, and that
// it returns either an error and no tasks, or tasks that a batch can run:
// unique plain ids and domains, an instruction, an evaluator naming its
// metric. References resolve against the real OSWorld copy in testdata.
func FuzzParseTasks(f *testing.F) {
	seeds := []string{
		`[{"task_id": "` + idOS + `", "domain": "os"}]`,
		`[{"task_id": "x", "domain": "os", "config": {"instruction": "i", "evaluator": {"func": ["a", "b"], "conj": "or"}, "config": [{"type": "launch", "parameters": {"command": ["x"]}}]}}]`,
		"{\"task_id\": \"" + idChrome + "\", \"domain\": \"chrome\"}\n{\"config\": {\"id\": \"y\", \"snapshot\": \"os\", \"instruction\": \"i\", \"evaluator\": {\"func\": \"f\"}}}\n",
		`{"os": ["` + idOS + `", "` + idOS + `"], "vlc": ["../x"]}`,
		`[{"task_id": "a"}, 1, null, {"config": null}]`,
		"[\n {\"task_id\": \"a\",}\n]",
		`{"os": 5, "os": ["` + idOS + `"]}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		tasks, err := ParseTasks(data, "fuzz.json", LoadOptions{OSWorldDir: osworldDir})
		if err != nil {
			if tasks != nil {
				t.Fatalf("returned %d tasks with error %v", len(tasks), err)
			}
			var te *TasksError
			if !errors.As(err, &te) || !strings.HasPrefix(err.Error(), "fuzz.json") {
				t.Fatalf("error is not a *TasksError naming the file: %v", err)
			}
			return
		}
		if len(tasks) == 0 {
			t.Fatal("no tasks and no error")
		}
		seen := map[string]bool{}
		for _, task := range tasks {
			if !safeName(task.ID) || !safeName(task.Domain) {
				t.Fatalf("task %q in domain %q: not plain names", task.ID, task.Domain)
			}
			if seen[task.ID] {
				t.Fatalf("task %q returned twice", task.ID)
			}
			seen[task.ID] = true
			if strings.TrimSpace(task.Instruction) == "" {
				t.Fatalf("task %q has no instruction", task.ID)
			}
			var ev struct{ Func json.RawMessage }
			if err := json.Unmarshal(task.Evaluator, &ev); err != nil || len(ev.Func) == 0 {
				t.Fatalf("task %q: evaluator %s does not name a metric (%v)", task.ID, task.Evaluator, err)
			}
			if !json.Valid(task.Raw) {
				t.Fatalf("task %q: Raw is not JSON", task.ID)
			}
		}
	})
}
