// Package osworld is legato's OSWorld desktop: an OSWorld guest (Ubuntu
// with OSWorld's in-guest HTTP server, or legato's small Debian test guest)
// driven through its guest server, in a libvirt VM this process starts, or
// already running elsewhere (under Docker, on another host).
//
// A Pool makes one Desktop per worker slot; Pool.New is the batch's
// desktop.Factory. In VM mode the pool first readies each of its libvirt
// hosts (the image files uploaded where missing, the VMs a crashed run left
// behind removed by name prefix), then boots each VM on its own overlay on
// the host with the most free slots, waits for a settled screen, sets the
// guest clock, records the clean state (below) and takes the clean
// snapshot. A guest given by URL is attached as it is, and its clean state
// recorded then (kept when an earlier run recorded it in the same boot).
//
// # Hosts
//
// A remote host's guest ports stay on its 127.0.0.1: the guest client, the
// setup's Chrome DevTools client and the grader reach them through the
// host's SSH connection (OSWorld's Python getters through local forwards).
// A host that stops answering fails its desktops at once and takes no new
// ones; it is tried again with backoff, and when it answers, what the batch
// left there is swept and it takes desktops again. Hosts may come from DNS
// (Config.HostsFrom, package hostdns), resolved again during the batch: a
// host that joins is prepared in the background, then takes desktops; one
// that leaves takes none, and its desktops ask their worker to replace
// them once their attempt is over (desktop.Retirer).
//
// # The clean state and the fast reset
//
// legato's guest tool (guestpy/, Python standard library only, sent with
// each call and kept compiled in the guest) records, as root, what the
// clean guest holds: its processes by pid and start time (not by name), the
// X windows with their titles and places, the pointer and the active
// window, /home/user (copied to a baseline) and the directories of
// Config.FastReset.Restore (/tmp, /var/tmp, /dev/shm) with their listings,
// every entry outside them that the guest user owns or may write, and a
// time stamp. It then starts its helper, a root process of the clean state
// that serves later calls without sudo or Python's start.
//
// A fast reset ends every process of the desktop's session that was not
// there and is its user's (SIGSTOP, then SIGKILL, until none is left): the
// session is what the record found, the processes whose environment names
// the display, those in the Unix or systemd login session of the guest
// server, the X server or the window manager, and what any of them started
// (fate in guestpy/cleanstate.py, with its table test). It closes the
// windows that were not there,
// releases held keys and buttons, puts the pointer back, restores the home
// and the restored directories entry by entry (content, kind, mode, owner,
// times; a change time that moved counts as a change), then verifies all of
// it and looks for changes it does not undo: an entry the user could change
// outside the restored directories, anything under Config.FastReset.Check
// (/etc, /opt, the package database, ...) changed since the stamp, a
// process or window of the clean state that is gone. Anything left makes a
// VM desktop load the snapshot instead; ResetReport says which reset ran
// and why.
//
// Before each task one pure function, planReset (plan.go, with its table
// test), decides which resets to try and in what order; the desktop runs
// them until one succeeds, a failure that a later step can repair handing
// over to the next (a fast reset to loadvm, loadvm to libvirt's revert, a
// fork to the in-place load, a load to the clean snapshot). A VM desktop
// plans: the snapshot for
// Config.NoFastReset, for tasks of Config.RevertDomains (os, multi_apps)
// and for the attempt after one (their changes live in the memory of the
// session's programs, which a fast reset keeps), and after a task whose
// attempt a fast reset could not undo before; otherwise whichever of the
// fast reset and QEMU's in-place loadvm measured cheaper on this desktop
// (each kind is measured again now and then). After a snapshot restore the
// readiness probe measures the guest clock, so one call sets it. Guests
// given by URL have no snapshot: they are always fast-reset, with a warning
// when something is left. Then the task's setup steps run (package setup).
//
// # Golden task states
//
// Every attempt of a group should start from the same state, and a setup
// that opens an application costs seconds per attempt. So the first time
// a VM desktop runs a task (Config.Golden), it resets as above, runs the
// setup (a step that starts a program ends once the program's window
// has mapped, at most Ready.AfterLaunchMax: see package setup; the guest
// tool watches the X server for it), waits until the screen settled,
// drops the guest's page cache and takes an internal snapshot of that
// state (RAM, devices, disk, in the VM's overlay); the task's later
// attempts on that desktop load it in place (HMP loadvm) instead, then
// get the host's clock and fresh entropy for the guest kernel's random
// generator (the snapshot turned both back), and skip the wait after the
// reset. A snapshot is keyed by the
// task's setup, legato's guest tool, QEMU's version as the running
// process reports it, the machine (the domain definition without names,
// ports and files of its own) and the boot files: a state taken under
// another key is deleted and taken again, never loaded. Tasks without
// setup steps, tasks Golden.Refuse names, and tasks whose setup depends
// on the wall clock or the network (a browsing history dated from the
// clock, web pages, commands that name a URL or run a network or clock
// tool) reset as without. A desktop keeps Golden.Max states, deleting the
// least recently used. A state that does not load is deleted and the
// clean snapshot loaded before the setup runs (libvirt's revert if loadvm
// fails too); the task resets as without on that desktop from then on.
// The snapshots live in the overlay, so Close, the pool's sweep and
// legato rl gc remove them with it. ResetReport says "golden" or
// "golden-build" (the attempt that took it) and why.
//
// # Forking golden states
//
// With Golden.Fork, the attempt that takes a golden state also captures it
// (on a remote host, through its host agent: package hostagent) as a
// vm.Template (guest RAM copied from the VM's shared memory, device
// state, disk layer, while the guest is paused: 0.8-1.1 s on the test
// guest, more with more RAM), which the pool keeps for all its desktops on
// that host (Golden.Max of them, the least recently used that no
// attempt runs in going first). Every later attempt of the task, on any
// of those desktops, starts in a clone: the desktop's VM parks (paused,
// its forwarded ports freed and reserved), a QEMU started ahead loads the
// state over the template's RAM mapped copy-on-write and takes the VM's
// ports, so the guest client, DevTools and the grader reach it unchanged;
// the guest is thawed as after a load (clock, entropy). A group spread
// over several desktops thus starts from one state, set up once. The next
// reset closes the clone; a task without a template unparks the VM, which
// loads its clean snapshot first (it still holds the attempt it parked
// with). ResetReport says "golden-fork" and whose state it was. A fork
// that fails loads the desktop's own snapshot of the state in place, or
// takes one when it has none; a template whose own QEMU fails is dropped
// (closed once no attempt runs in it). Closing the pool removes the
// templates; its sweep and legato rl gc remove those of a run that was
// killed (their clones die with it). Only VMs on this machine fork, and
// only as root.
//
// # The action executor
//
// Each reset starts legato's executor in the guest (guestpy/executor.py,
// through the guest server's /setup/launch, so as the server's user with
// its Python): it imports pyautogui once and runs the attempt's actions,
// each handed to it by a small /execute, the way `python -c "import
// pyautogui; …"` runs them (output, exit status, tracebacks, pyautogui's
// settings as imported, the 120 s limit), without an interpreter's start
// per action. A fast reset ends it with the attempt's other processes; the
// clean snapshot never holds it, a golden state holds the one that ran
// when it was taken. Where it is absent or stops answering, actions
// run through `python -c` until the next reset. Config.NoExecutor is the
// baseline.
//
// # Ready signal
//
// WaitAfterReset, WaitReady (after each action, desktop.ReadyWaiter) and
// WaitBeforeEval wait until, over one interval, the guest's CPUs were idle
// and its X server redrew (almost) nothing, watched in the guest through
// the X DAMAGE extension; one screenshot then shows the settled screen.
// With the executor running, it watches the screen from its start and
// answers one request once an interval after the last action was still; a
// region redrawn with at most two contents (a blinking cursor, a clock
// repainted unchanged) does not count. A program that redrew after a
// step's quiet had been found (a status bar's count, a tooltip) makes the
// next steps wait until that late redraw comes, or the quiet outlasts it.
// Without it, probes watch one interval per call.
// Where the guest cannot watch its screen, consecutive screenshots must be
// identical instead, with the guest idle in between. A wait plans its last
// screenshot to end by its bound. WaitReady returns the screenshot it ended
// on, which the scheduler uses as the next observation.
// (desktop.WithFixedWaits replaces the waits by fixed sleeps, for
// baselines.)
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
