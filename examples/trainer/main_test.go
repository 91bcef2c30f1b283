package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTrain runs the example trainer for two versions: every group of every
// version reaches the trainer with its rollouts.
func TestTrain(t *testing.T) {
	var out bytes.Buffer
	if err := train(t.Context(), t.TempDir(), 2, &out); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"step-0", "step-1"} {
		if n := strings.Count(out.String(), v+" demo-"); n != 6 {
			t.Errorf("%s: %d groups consumed, want 6:\n%s", v, n, out.String())
		}
		if !strings.Contains(out.String(), v+" done") {
			t.Errorf("%s never finished:\n%s", v, out.String())
		}
	}
	if strings.Contains(out.String(), " 0 tokens") {
		t.Errorf("a group reached the trainer without logprobs:\n%s", out.String())
	}
}
