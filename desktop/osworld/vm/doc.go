// Package vm runs the libvirt/QEMU virtual machines behind legato's OSWorld
// desktops: one VM per worker, each on its own qcow2 overlay of a base image
// that is never written to, on one of several libvirt hosts.
//
// A Host is the transport to one libvirt host: its local socket, or SSH
// (golang.org/x/crypto/ssh: keys from ~/.ssh and the agent, the host's key
// checked against known_hosts, never skipped) or TLS. Every file a VM uses
// is a volume of a storage pool on its host, made and deleted through
// libvirt: the image files (base image, kernel, initrd), named after their
// content hash and uploaded once with libvirt's volume upload
// (Host.SyncImages), and each VM's overlay.
//
// StartOn creates the overlay, defines and boots a domain whose guest
// server (and Chrome DevTools and VLC ports) are forwarded to free ports on
// the host's 127.0.0.1 through QEMU user networking, waits until the guest
// answers, and takes a clean internal snapshot (disk and memory). Revert
// brings the VM back to that snapshot; Close destroys the domain, undefines
// it with its snapshot metadata and deletes the overlay. Host.Sweep removes
// what a crashed run left behind on a host, found by the VMs' names.
//
// # Bounded libvirt calls
//
// go-libvirt's calls take no context and can block forever if libvirtd
// stops answering. Every call here runs on the VM's own libvirt connection in
// a goroutine that the caller waits for; when the call's bound (the smaller of
// Config.CallTimeout and the caller's ctx) passes, the connection is closed,
// which makes go-libvirt fail the pending call at once, and the next call
// dials a new connection. One connection per VM keeps one stuck call from
// failing the calls of other VMs. A remote host's libvirt connections are
// channels of its one SSH connection, whose keep-alive closes it, failing
// every call through it, when the host stops answering.
//
// # Acceleration
//
// Domains use type='kvm' where KVM really works and type='qemu' (TCG,
// software emulation) otherwise; see DetectAccel. Some hosts, nested cloud
// VMs among them, expose a /dev/kvm that cannot run an ordinary guest, so
// the presence of /dev/kvm alone is not enough. On a remote host, auto
// means KVM: set AccelTCG for hosts without it.
//
// # Fork templates
//
// With Config.Fork, guest RAM is shared memory (a memfd), and
// VM.Template captures a running VM: QEMU's migration with x-ignore-shared
// sends the device state without that RAM, the RAM is copied sparsely to
// a file under Config.ForkDir (tmpfs), and the disk to a qcow2 layer over
// the base image. Template.Fork starts a clone: a QEMU run by this package
// with libvirt's own command line for that VM (so the devices match),
// rewritten to map the RAM file privately (share=off, copy-on-write), to
// write its own overlay on the layer and to wait for the state
// (-incoming defer); Prestart starts such QEMUs ahead. Clones run as
// libvirt's QEMU user in QEMU's sandbox, die with this process, and live in
// the template's directory, which this process holds locked: SweepForks
// removes those whose process is gone. VM.Park and VM.Unpark hand a VM's
// forwarded ports to a clone (Clone.Forward) and back.
//
// # Networking
//
// Domains never use libvirt networks or bridges: QEMU's user-mode network
// with restrict=on lets the guest reach nothing, and host forwards bound to
// the host's 127.0.0.1 are the only way in, through Host.DialContext (an
// SSH direct-tcpip channel for a remote host). Nothing listens beyond a
// host's loopback.
package vm
