package childenv

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPython(t *testing.T) {
	env := []string{"PATH=/usr/bin", "HOME=/root", "LEGATO_POLICY_KEY=sk-x", "LEGATO_PYTHON=y", "OPENAI_API_KEY=z",
		"LC_ALL=C.UTF-8", "PYTHONPATH=/osworld", "VIRTUAL_ENV=/venv", "OMP_NUM_THREADS=1", "SSH_AUTH_SOCK=/tmp/s", "BROKEN"}
	got := Python(env, "PYTHONIOENCODING=utf-8")
	want := []string{"PATH=/usr/bin", "HOME=/root", "LC_ALL=C.UTF-8", "PYTHONPATH=/osworld", "VIRTUAL_ENV=/venv",
		"OMP_NUM_THREADS=1", "PYTHONIOENCODING=utf-8"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Python (-want +got):\n%s", diff)
	}
}

// TestPythonDropsCredentials: a variable whose name says it holds a
// credential does not pass, even under an allowed prefix (HF_, PYTHON,
// CONDA_); the model cache and offline switches of the same prefix do.
func TestPythonDropsCredentials(t *testing.T) {
	tests := []struct {
		name string
		pass bool
	}{
		{"HF_TOKEN", false},
		{"HF_TOKEN_PATH", false},
		{"HF_API_TOKEN", false},
		{"HF_HUB_TOKEN", false},
		{"HUGGING_FACE_HUB_TOKEN", false},
		{"HF_HUB_DISABLE_IMPLICIT_TOKEN", false},
		{"CONDA_APIKEY", false},
		{"PYTHON_KEYRING_BACKEND", true}, // names no credential
		{"XDG_SECRET_DIR", false},
		{"PYTHON_API_KEY", false},        // an allowed prefix: the name rule drops it
		{"CONDA_PASSWORD", false},        // likewise
		{"LC_CREDENTIALS", false},        // likewise
		{"OPENAI_API_KEY", false},        // these three and HUGGING_FACE_HUB_TOKEN no allowed
		{"AWS_SECRET_ACCESS_KEY", false}, // prefix lets through: they guard the allowlist,
		{"AWS_SESSION_TOKEN", false},     // not the name rule
		{"HF_HOME", true},
		{"HF_HUB_CACHE", true},
		{"HF_HUB_OFFLINE", true},
		{"HF_ENDPOINT", true},
		{"PYTHONPATH", true},
		{"XDG_CACHE_HOME", true},
		{"OMP_NUM_THREADS", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Python([]string{tt.name + "=v"})
			if pass := len(got) == 1; pass != tt.pass {
				t.Errorf("Python passes %s: %v, want %v", tt.name, pass, tt.pass)
			}
		})
	}
}

// TestMinimalReachesTheChild: a child started with Minimal sees it and
// nothing of ours (its /proc/PID/environ).
func TestMinimalReachesTheChild(t *testing.T) {
	t.Setenv("LEGATO_POLICY_KEY", "sk-legato-test")
	cmd := exec.Command("sleep", "60")
	cmd.Env = Minimal("HOME=/nonexistent")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep here:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// Until the child has exec'd sleep, /proc shows the environment of the
	// fork it was, which is ours: wait for the exec.
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	for {
		comm, err := os.ReadFile(proc + "/comm")
		if err != nil {
			t.Skip("no /proc here:", err)
		}
		if string(comm) == "sleep\n" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	raw, err := os.ReadFile(proc + "/environ")
	if err != nil {
		t.Skip("no /proc here:", err)
	}
	got := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	slices.Sort(got)
	want := []string{"HOME=/nonexistent", "LC_ALL=C", "PATH=" + SystemPath}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the child's environment (-want +got):\n%s", diff)
	}
}
