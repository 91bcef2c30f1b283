package grade_test

import (
	"context"
	"encoding/json"
	"fmt"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
)

func ExampleGrader_Grade() {
	g, err := grade.New(grade.GraderConfig{Mode: grade.NativeOnly})
	if err != nil {
		panic(err)
	}
	defer g.Close()

	// Two metrics joined by "and": the mean of their scores, unless one is
	// 0. Rules stand in for what would be read from the desktop.
	task := desktop.Task{ID: "demo", Evaluator: json.RawMessage(`{
		"func": ["exact_match", "diff_text_file"],
		"conj": "and",
		"result": [{"type": "rule", "rules": "100\n"}, {"type": "rule", "rules": null}],
		"expected": [{"type": "rule", "rules": {"expected": "100\n"}}, {"type": "rule", "rules": "/gold.txt"}]
	}`)}
	ctx := context.Background()
	reward, err := g.Grade(ctx, task, desktop.DoneAction)
	fmt.Println(reward, err) // diff_text_file scores 0 without a result file

	task.Evaluator = json.RawMessage(`{"func": "exact_match",
		"result": {"type": "rule", "rules": "100\n"},
		"expected": {"type": "rule", "rules": {"expected": "100\n"}}}`)
	reward, _ = g.Grade(ctx, task, desktop.DoneAction)
	fmt.Println(reward)
	reward, _ = g.Grade(ctx, task, desktop.FailAction)
	fmt.Println(reward) // the agent gave up on a feasible task

	task.Evaluator = json.RawMessage(`{"func": "infeasible"}`)
	reward, _ = g.Grade(ctx, task, desktop.FailAction)
	fmt.Println(reward)
	// Output:
	// 0 <nil>
	// 1
	// 0
	// 1
}

func ExampleCatalog_Check() {
	task := desktop.Task{ID: "3680a5ee", Evaluator: json.RawMessage(`{
		"func": "compare_csv",
		"result": {"type": "vm_file", "path": "/home/user/Desktop/output.csv", "dest": "output.csv"},
		"expected": {"type": "cloud_file", "path": "https://example.org/output.csv", "dest": "gold.csv"}}`)}
	fmt.Println(grade.NativeCatalog().Check(task))
	// Output:
	// task 3680a5ee: metric "compare_csv": not implemented natively; native-only grading
}
