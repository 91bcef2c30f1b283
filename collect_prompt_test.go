package rl

import (
	"encoding/base64"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// TestCollectRecordsExactPrompts checks that every step's request rebuilds
// (LoadRequest) exactly the prompt the server received, whether the prompt
// extends the previous one, drops old screenshots, or comes from a harness
// that rewrites its history in place.
func TestCollectRecordsExactPrompts(t *testing.T) {
	tests := []struct {
		name    string
		harness func() policy.Harness
	}{
		{name: "qwen", harness: func() policy.Harness { return qwen.New(qwen.Config{}) }},
		{name: "qwen dropping old screenshots", harness: func() policy.Harness { return qwen.New(qwen.Config{ImageMax: 2}) }},
		{name: "history rewritten in place", harness: func() policy.Harness { return inPlaceHarness{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				script := func(req policytest.Request) string {
					switch {
					case req.Step == 2:
						return "not a tool call" // a step without action
					case req.Step < 5:
						return reply(clickArgs)
					}
					return reply(doneArgs)
				}
				e := newBatchEnv(t, testTasks(1), policytest.Options{Script: script, KeepRequests: true}, fake.Config{})
				e.opts.Desktops, e.opts.Group = 1, 1
				e.opts.Harness = tt.harness()
				if _, err := e.collect(t.Context()); err != nil {
					t.Fatal(err)
				}
				recs := readRecords(t, e.opts.Out)
				reqs := e.srv.Requests()
				if len(recs) != 1 || len(recs[0].Steps) != len(reqs) || len(reqs) < 4 {
					t.Fatalf("%d records, %d requests: want one record with a step per request", len(recs), len(reqs))
				}
				for i, step := range recs[0].Steps {
					got, err := schema.LoadRequest(e.opts.Out, step, schema.LoadOptions{})
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if diff := cmp.Diff(reqs[i].Messages, got); diff != "" {
						t.Errorf("step %d: prompt (-sent +recorded):\n%s", i, diff)
					}
				}
			})
		})
	}
}

// inPlaceHarness keeps one history slice, returns it as the prompt, and
// replaces all but the newest screenshot by text in place, as a harness
// may. Each observation's image is followed by the model's reply.
type inPlaceHarness struct{}

func (inPlaceHarness) NewEpisode(task desktop.Task) policy.Episode {
	return &inPlaceEpisode{history: []schema.Message{
		{Role: "system", Content: []schema.Part{schema.TextPart("You click.")}},
		{Role: "user", Content: []schema.Part{schema.TextPart(task.Instruction)}},
	}}
}

type inPlaceEpisode struct{ history []schema.Message }

func (e *inPlaceEpisode) Prompt(obs desktop.Observation) ([]schema.Message, error) {
	for i := range e.history {
		for j, p := range e.history[i].Content {
			if p.ImageURL != nil {
				e.history[i].Content[j].ImageURL.URL = "" // in place, through the pointer
				e.history[i].Content[j] = schema.TextPart("(old screenshot)")
			}
		}
	}
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(obs.Screenshot)
	e.history = append(e.history, schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(url)}})
	return e.history, nil
}

func (e *inPlaceEpisode) Reply(r policy.Reply) policy.Parsed {
	e.history = append(e.history, schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(r.Content)}})
	return qwen.ParseReply(r, qwen.Config{}.Screen(testWidth, testHeight))
}
