// Package osworld is legato's OSWorld desktop: an OSWorld guest (Ubuntu
// with OSWorld's in-guest HTTP server, or legato's small Debian test guest)
// driven through its guest server, in a libvirt VM this process starts, or
// already running elsewhere (under Docker, on another host).
//
// A Pool makes one Desktop per worker slot; Pool.New is the batch's
// desktop.Factory. In VM mode the pool first readies each of its libvirt
// hosts (the image files uploaded where missing, the VMs a crashed run left
// behind removed by name prefix), then boots each VM on its own overlay on
// the host with the most free slots, copies the guest's /home/user to a
// baseline inside the guest, waits for a settled screen, and takes the
// clean snapshot. A guest given by URL is attached as it is; it gets a
// baseline if it has none.
//
// # Hosts
//
// A remote host's guest ports stay on its 127.0.0.1: the guest client, the
// setup's Chrome DevTools client and the grader reach them through the
// host's SSH connection (OSWorld's Python getters through local forwards).
// A host that stops answering fails its desktops at once and takes no new
// ones; it is tried again with backoff, and when it answers, what the batch
// left there is swept and it takes desktops again.
//
// # Reset
//
// A fast reset kills the programs tasks start (Config.AppsToKill, every
// domain's, since the last task may have been of any domain), checks that
// none survived, restores /home/user from the baseline (rsync -a --delete,
// or rm + cp -a without rsync) and checks that nothing differs, all in one
// command in the guest. A snapshot revert restores the VM's clean snapshot
// (QEMU's in-place loadvm, libvirt's revert if that fails) and then sets
// the guest clock, which the snapshot turned back. Tasks of the
// Config.RevertDomains (os, multi_apps: their state is not only in
// /home/user) and every task with Config.NoFastReset get the revert; the
// others the fast reset, which falls back to a revert when it fails in the
// guest. Guests given by URL have no snapshot: they are always fast-reset,
// with a warning for the tasks that would need a revert. Then the task's
// setup steps run (package setup).
//
// # Ready signal
//
// WaitAfterReset, WaitReady (after each action, desktop.ReadyWaiter) and
// WaitBeforeEval wait until consecutive screenshots are identical and the
// guest's CPUs were idle in between, bounded by a maximum. WaitReady
// returns the screenshot it ended on, which the scheduler uses as the next
// observation. (desktop.WithFixedWaits replaces the waits by fixed sleeps,
// for baselines.)
//
// # Errors
//
// Methods return *desktop.Error values. A task that cannot run here (a
// setup step or metric legato refuses, a chrome step on a guest without a
// DevTools port) wraps desktop.ErrUnsupported; anything else (guest server
// unreachable, VM gone, a setup step or the grade failing) is a desktop
// failure. An action that fails inside the guest is an ActResult with a
// non-zero exit code.
package osworld
