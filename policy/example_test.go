package policy_test

import (
	"context"
	"fmt"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

func ExampleClient_Complete() {
	// A scripted vLLM-style server stands in for the model.
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()

	c, err := policy.New(policy.Config{
		BaseURL:     srv.URL(),
		Model:       "Qwen/Qwen3-VL-8B-Instruct",
		Version:     "step-41",
		StepTimeout: policy.DefaultStepTimeout,
		Retries:     policy.DefaultRetries,
		MaxInflight: 32,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	res, err := c.Complete(context.Background(), []schema.Message{
		{Role: "user", Content: []schema.Part{schema.TextPart("Open the terminal")}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Response.Content)
	fmt.Println("token ids:", c.TokenIDSource(), len(res.Response.TokenIDs) == len(res.Response.Logprobs))
	fmt.Println("attempts:", res.Model.Attempts)
	// Output:
	// Action: Click at (802, 814).
	// <tool_call>
	// {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [802, 814]}}
	// </tool_call>
	// token ids: return_token_ids true
	// attempts: 1
}
