// Package vm runs the libvirt/QEMU virtual machines behind legato's OSWorld
// desktops: one VM per worker, each on its own qcow2 overlay of a base image
// that is never written to.
//
// Start creates the overlay, defines and boots a domain whose guest server
// (and Chrome DevTools and VLC ports) are forwarded to free ports on
// 127.0.0.1 through QEMU user networking, waits until the guest answers, and
// takes a clean internal snapshot (disk and memory). Revert brings the VM back
// to that snapshot; Close destroys the domain, undefines it with its snapshot
// metadata and deletes the overlay. Sweep removes what a crashed run left
// behind, found by the domains' name prefix.
//
// # Bounded libvirt calls
//
// go-libvirt's calls take no context and can block forever if libvirtd
// stops answering. Every call here runs on the VM's own libvirt connection in
// a goroutine that the caller waits for; when the call's bound (the smaller of
// Config.CallTimeout and the caller's ctx) passes, the connection is closed,
// which makes go-libvirt fail the pending call at once, and the next call
// dials a new connection. One connection per VM keeps one stuck call from
// failing the calls of other VMs.
//
// # Acceleration
//
// Domains use type='kvm' where KVM really works and type='qemu' (TCG,
// software emulation) otherwise; see DetectAccel. Some hosts, nested cloud
// VMs among them, expose a /dev/kvm that cannot run an ordinary guest, so
// the presence of /dev/kvm alone is not enough.
//
// # Networking
//
// Domains never use libvirt networks or bridges: QEMU's user-mode network
// with restrict=on lets the guest reach nothing, and host forwards bound to
// 127.0.0.1 are the only way in. Nothing listens beyond loopback.
package vm
