//go:build unix

package grade

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts the bridge in a process group of its own, so that
// killing it also kills whatever its evaluators started, and so that a
// terminal's Ctrl-C reaches legato, which then closes the grader, rather
// than the evaluator directly.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	// The group id is the leader's pid.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
}
