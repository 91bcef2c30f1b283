package schema_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"legato/rl/schema"
)

// A worker stores each step's prompt and appends the attempt's record when
// it ends; export reads the records back and rebuilds the prompts.
func Example() {
	tmp, err := os.MkdirTemp("", "legato-run")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "batch-0007")

	run, err := schema.Create(dir)
	if err != nil {
		log.Fatal(err)
	}
	prompt := []schema.Message{
		{Role: "system", Content: []schema.Part{schema.TextPart("You control a computer.")}},
		{Role: "user", Content: []schema.Part{schema.TextPart("Open the terminal.")}},
	}
	hashes, err := run.PutMessages(prompt)
	if err != nil {
		log.Fatal(err)
	}
	rec := &schema.Record{
		RolloutID: "r-1", TaskID: "task-1", GroupID: "v1/task-1",
		Status: schema.StatusOK, Reward: new(float64), NSteps: 1,
		Steps: []schema.Step{{Request: hashes, Response: schema.Response{Content: "DONE"}}},
	}
	if err := run.Append(rec); err != nil {
		log.Fatal(err)
	}
	if err := run.Close(); err != nil {
		log.Fatal(err)
	}

	store, err := schema.OpenMessageStore(dir, schema.StoreOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	stats, err := schema.ReadRunRecords(dir, func(r schema.Record) error {
		for i, step := range r.Steps {
			msgs, err := store.LoadRequest(step, schema.LoadOptions{})
			if err != nil {
				return err
			}
			fmt.Printf("%s step %d: %d messages, first %q\n", r.RolloutID, i, len(msgs), msgs[0].Content[0].Text)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d records, %d torn lines\n", stats.Records, stats.TornLines)
	// Output:
	// r-1 step 0: 2 messages, first "You control a computer."
	// 1 records, 0 torn lines
}
