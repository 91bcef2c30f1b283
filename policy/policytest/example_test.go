package policytest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"legato/rl/policy/policytest"
)

func ExampleNewServer() {
	srv := policytest.NewServer(policytest.Options{
		Dialect:   policytest.SGLang,
		NoLatency: true,
		// A one-step agent that always gives up.
		Script: func(req policytest.Request) string {
			return `<tool_call>{"name": "computer_use", "arguments": {"action": "terminate", "status": "failure"}}</tool_call>`
		},
	})
	defer srv.Close()

	body := `{"model": "any", "logprobs": true, "return_token_ids": true,
		"messages": [{"role": "user", "content": "Close the window"}]}`
	res, err := srv.Client().Post(srv.URL()+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer res.Body.Close()
	var answer struct {
		Choices []struct {
			Message  struct{ Content string }
			TokenIDs []int64 `json:"token_ids"`
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&answer); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.StatusCode == http.StatusOK, answer.Choices[0].Message.Content)
	fmt.Println(len(answer.Choices[0].TokenIDs) == len(policytest.Tokenize(answer.Choices[0].Message.Content)))
	// Output:
	// true <tool_call>{"name": "computer_use", "arguments": {"action": "terminate", "status": "failure"}}</tool_call>
	// true
}
