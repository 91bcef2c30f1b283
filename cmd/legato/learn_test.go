package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// torchPython is the interpreter of Debian's python3-torch, which .ci/test
// installs: the learning example (examples/learn) needs it.
const torchPython = "/usr/bin/python3"

// haveTorch skips t where Debian's PyTorch is missing, and fails it in CI.
func haveTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command(torchPython, "-c", "import torch").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s has no torch (%v); .ci/test installs python3-torch", torchPython, err)
		}
		t.Skipf("%s has no torch: apt-get install python3-torch", torchPython)
	}
}

// TestLearnUnits runs the learning example's Python tests (its PNG reader,
// chat template and replies).
func TestLearnUnits(t *testing.T) {
	haveTorch(t)
	dir, err := filepath.Abs("../../examples/learn")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), torchPython, "-m", "unittest", "discover", "-s", dir, "-v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
}

// TestLearnSmoke closes the loop (examples/learn/train.py --smoke): a
// vision policy trained on this binary's `legato rl serve`, on fake target
// tasks, must raise its mean reward from chance by 0.3 within six versions,
// with every on-policy logprob it recomputes within 1e-4 of the recorded
// one. The script fails (exit 1) otherwise.
func TestLearnSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a policy for a minute or more")
	}
	haveTorch(t)
	script, err := filepath.Abs("../../examples/learn/train.py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), torchPython, script, "--smoke", "--legato", os.Args[0], "--out", t.TempDir())
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("train.py --smoke: %v", err)
	}
}
