package hosttest

import (
	"slices"
	"testing"
)

// TestRuntimeArgs checks the limits a container host's podman run asks
// for: this machine's hard limits, no more than podman's own defaults
// (1048576 files) and pid_max processes, as a machine without
// CAP_SYS_RESOURCE lets podman set no higher.
func TestRuntimeArgs(t *testing.T) {
	const unlimited = ^uint64(0)
	for _, tc := range []struct {
		nofile, nproc, pidMax uint64
		want                  []string
	}{
		// This sandbox: 20000 files, 96367 processes, pid_max 32768.
		{20000, 96367, 32768, []string{"nofile=20000:20000", "nproc=32768:32768"}},
		{unlimited, unlimited, 4194304, []string{"nofile=1048576:1048576", "nproc=4194304:4194304"}},
		{4096, 1024, 32768, []string{"nofile=4096:4096", "nproc=1024:1024"}},
	} {
		got := runtimeArgs(tc.nofile, tc.nproc, tc.pidMax)
		want := []string{"--runtime", "runc", "--ulimit", tc.want[0], "--ulimit", tc.want[1]}
		if !slices.Equal(got, want) {
			t.Errorf("runtimeArgs(%d, %d, %d) = %q; want %q", tc.nofile, tc.nproc, tc.pidMax, got, want)
		}
	}
}
