package policy_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/policy"
)

func TestConfigValidate(t *testing.T) {
	valid := policy.Config{BaseURL: "http://127.0.0.1:8000/v1", Model: "qwen"}
	temp := func(v float64) *float64 { return &v }
	tests := []struct {
		name   string
		modify func(*policy.Config)
		// want are substrings of the error, one per problem; none means valid.
		want []string
	}{
		{"valid", func(*policy.Config) {}, nil},
		{"valid with every knob", func(c *policy.Config) {
			c.StepTimeout, c.Retries, c.MaxInflight, c.MaxTokens, c.Temperature, c.TopP = time.Second, 3, 48, 512, temp(0), temp(1)
			c.Extra = map[string]any{"top_k": 20}
		}, nil},
		{"empty", func(c *policy.Config) { *c = policy.Config{} }, []string{"BaseURL is empty", "Model is empty"}},
		{"not a URL", func(c *policy.Config) { c.BaseURL = "127.0.0.1:8000/v1" }, []string{`BaseURL "127.0.0.1:8000/v1" is not an http(s) URL`}},
		{"password hidden", func(c *policy.Config) { c.BaseURL = "ftp://user:hunter2@host/v1" }, []string{"user:xxxxx@host"}},
		{"negative knobs", func(c *policy.Config) { c.StepTimeout, c.Retries, c.MaxInflight, c.MaxTokens = -1, -1, -1, -1 },
			[]string{"StepTimeout is -1ns", "Retries is -1", "MaxInflight is -1", "MaxTokens is -1"}},
		{"temperature", func(c *policy.Config) { c.Temperature = temp(3) }, []string{"Temperature is 3"}},
		{"temperature NaN", func(c *policy.Config) { c.Temperature = temp(math.NaN()) }, []string{"Temperature is NaN"}},
		{"top_p", func(c *policy.Config) { c.TopP = temp(0) }, []string{"TopP is 0: use a value in (0, 1]"}},
		{"extra owns a token-id field", func(c *policy.Config) { c.Extra = map[string]any{"return_meta_info": true, "top_p": 1} },
			[]string{`Extra sets "return_meta_info"`, `Extra sets "top_p"`}},
		{"key with newline", func(c *policy.Config) { c.APIKey = "abc\n" }, []string{"APIKey contains a line break"}},
		{"extra owns a field", func(c *policy.Config) { c.Extra = map[string]any{"logprobs": false} }, []string{`Extra sets "logprobs"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.modify(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, policy.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			var got []string
			for _, w := range tt.want {
				if strings.Contains(err.Error(), w) {
					got = append(got, w)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate() = %v\nmissing (-want +got):\n%s", err, diff)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Validate() = %v shows a password", err)
			}
			if _, nerr := policy.New(c); !errors.Is(nerr, policy.ErrInvalidConfig) {
				t.Errorf("New() = %v, want the Validate error", nerr)
			}
		})
	}
}

func TestConfigString(t *testing.T) {
	c := policy.Config{BaseURL: "http://127.0.0.1:8000/v1", Model: "qwen", Version: "step-41", APIKey: "sk-secret", StepTimeout: time.Minute, Retries: 1}
	want := `policy.Config{BaseURL: "http://127.0.0.1:8000/v1", Model: "qwen", Version: "step-41", APIKey: [redacted], StepTimeout: 1m0s, Retries: 1, MaxInflight: 0, MaxTokens: 0, Temperature: server default, TopP: server default}`
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		if got := fmt.Sprintf(format, c); got != want {
			t.Errorf("Sprintf(%q) = %s\nwant %s", format, got, want)
		}
	}
	c.APIKey = ""
	if got := c.String(); !strings.Contains(got, "APIKey: (none)") {
		t.Errorf("String() without a key = %s, want APIKey: (none)", got)
	}
}
