// Package hostagent forks golden states on remote libvirt hosts. A fleet
// (the pool of desktops) takes fork templates of the VMs it runs on this
// machine itself (package vm); a template of a VM on another host must be
// taken there, next to the VM, because its guest RAM file is what every
// clone maps. The host agent (`legato rl host-agent`) is that part: the
// fleet starts it on the host over the SSH connection it already has (an
// exec channel: no new port, no new credential, the SSH key is the door),
// and talks to it on the channel's stdin and stdout.
//
// The protocol is JSON lines, one Request per line from the fleet and one
// Reply per line from the agent, matched by id, answered in any order:
// requests run at once, each in its own goroutine. The agent takes a
// template of a named domain of its host (vm.TemplateOf), forks clones of
// it (each answering with its name and its ports on the host's 127.0.0.1,
// which the fleet reaches through the same SSH connection), forwards a
// parked VM's ports to a clone, ends clones, drops templates, reserves a
// parked VM's ports, and sweeps what a killed agent left behind.
//
// The agent's lifetime is the session's: on EOF of its stdin (the fleet
// closed the session, was killed, or the connection was lost) it ends
// every clone and template it made and removes their files, so nothing
// outlives the fleet. An agent killed outright leaves its clones to die
// with it (parent-death signal) and its directories unlocked: the next
// agent's sweep, or `legato rl gc`, removes them.
package hostagent
